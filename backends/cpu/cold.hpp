// How the CPU backend reads a cold case's inputs from DRAM (core/op.hpp, cache_axis; docs/harness.md,
// "Cold and warm"): either each call steps its own copy of what it reads, rotating over copies
// that together pass the cold span (the decode step: an engine's layers stream their states in
// turn), or the caches are evicted before each call by writing over a buffer of the cold span,
// outside its timing (every other row, and a decode step whose copies would not fit in memory).
//
// The cold span (src/run/bandwidth_roof.hpp, cold_span_bytes) is sixteen times the last-level cache,
// not twice: a 64 MiB state stepped again and again on a 32 MiB L3 (Zen 5) still found part of
// itself there, 1.5 ms a step at B 64 against 2.1 ms per 64 sequences at B 512.
#pragma once

#include <cstddef>
#include <memory>

#include "src/run/backend.hpp"
#include "src/run/bandwidth_roof.hpp"

namespace lattn::cpu {

// Copies of a call's working set (`bytes_per_copy`) to rotate over so that together they pass the
// cold span of the machine's last-level cache (machine_last_level_cache_bytes): a call then finds
// nothing of its copy in the cache, every other copy having streamed through since. 1 for a
// working set that passes the span alone.
std::size_t cold_copies(std::size_t bytes_per_copy, std::size_t llc_bytes);

// Whether `bytes` of copies may be held for rotation: at most an eighth of the physical memory;
// beyond it a case evicts instead.
bool rotation_fits(std::size_t bytes);

// Writes over a buffer of the cold span of the machine's last-level cache with the run's threads
// (the buffer is the process's, made on first use), so that nothing a call read before is left in
// any cache.
void evict_caches();
// That buffer's bytes, for the memory estimates.
std::size_t eviction_bytes();

// `inner`, its caches evicted before each timed call: time_ms(n) is the sum of n calls' own times.
class EvictingCase final : public PreparedCase {
 public:
  explicit EvictingCase(std::unique_ptr<PreparedCase> inner) : inner_(std::move(inner)) {}
  void run() override { inner_->run(); }
  double time_ms(int calls) override;
  void watch_scratch() override { inner_->watch_scratch(); }
  MemoryUsage memory() const override { return inner_->memory(); }
  void read_outputs(TensorSet& outputs) override { inner_->read_outputs(outputs); }
  std::string bwd_states() const override { return inner_->bwd_states(); }

 private:
  std::unique_ptr<PreparedCase> inner_;
};

}  // namespace lattn::cpu
