#include "backends/cpu/cold.hpp"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <vector>

#include "backends/cpu/roofline.hpp"

namespace lattn::cpu {

std::size_t cold_copies(std::size_t bytes_per_copy, std::size_t llc_bytes) {
  const std::size_t span = cold_span_bytes(llc_bytes);
  if (bytes_per_copy == 0) return 1;
  if (bytes_per_copy >= span) return 1;
  return span / bytes_per_copy + 1;
}

bool rotation_fits(std::size_t bytes) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  if (pages <= 0 || page <= 0) return false;
  return bytes <= std::size_t(pages) * std::size_t(page) / 8;
}

std::size_t eviction_bytes() { return cold_span_bytes(machine_last_level_cache_bytes()); }

void evict_caches() {
  static std::once_flag once;
  static std::vector<std::uint64_t> buffer;
  std::call_once(once, [] { buffer.assign(eviction_bytes() / sizeof(std::uint64_t), 0); });
  static std::uint64_t round = 0;
  const std::uint64_t value = ++round;
  const long n = long(buffer.size());
  std::uint64_t* data = buffer.data();
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; ++i) data[i] += value;
}

double EvictingCase::time_ms(int calls) {
  double total = 0;
  for (int i = 0; i < calls; ++i) {
    evict_caches();
    const auto start = std::chrono::steady_clock::now();
    inner_->run();
    total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  return total;
}

}  // namespace lattn::cpu
