// The layer's products timed two ways on the same operands: OpenBLAS through the layer's
// parallel_sgemm / k_split_product (kernels/layer/cpu/products.hpp) and the packed products
// (kernels/cpu/packed_gemm.hpp), alternating, best of REPS each, in GFLOP/s.
// Not a test: `cmake --build build --target lattn_gemm_bench`, then
//   build/tests/lattn_gemm_bench ROWS M REPS
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <vector>

#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "src/run/backend.hpp"
#include "src/run/counting_allocator.hpp"

using namespace lattn;

namespace {

double seconds(const std::function<void()>& call) {
  const auto start = std::chrono::steady_clock::now();
  call();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  prepare_process_environment(argv);
  const int rows = argc > 1 ? std::atoi(argv[1]) : 4096, M = argc > 2 ? std::atoi(argv[2]) : 512,
            reps = argc > 3 ? std::atoi(argv[3]) : 10;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> x(std::size_t(rows) * 3 * M), w(std::size_t(M) * 3 * M), c(std::size_t(rows) * 3 * M);
  for (float& v : x) v = uniform(rng);
  for (float& v : w) v = uniform(rng);
  CountingAllocator allocator;
  std::printf("threads %d, kernel %s, rows %d, M %d\n", omp_get_max_threads(), cpu::gemm::kernel_name(), rows, M);
  struct Shape {
    const char* name;
    std::function<void()> blas, packed;
    double flops;
  };
  std::vector<float*> outs = {c.data(), c.data() + std::size_t(M) * M, c.data() + 2 * std::size_t(M) * M};
  const std::vector<Shape> shapes = {
      {"x W (rows x M x M)",
       [&] { cpu::parallel_sgemm(false, rows, M, M, x.data(), M, w.data(), M, 0.0f, c.data(), M); },
       [&] { cpu::gemm::parallel_multiply(false, false, rows, M, M, x.data(), M, w.data(), M, 0.0f, c.data(), M, allocator); },
       2.0 * rows * M * M},
      {"x [Wq Wk Wv] (rows x 3M x M)",
       [&] { cpu::parallel_sgemm(false, rows, 3 * M, M, x.data(), M, w.data(), 3 * M, 0.0f, c.data(), 3 * M); },
       [&] { cpu::gemm::parallel_multiply(false, false, rows, 3 * M, M, x.data(), M, w.data(), 3 * M, 0.0f, c.data(), 3 * M, allocator); },
       6.0 * rows * M * M},
      {"G W^T (rows x M x M)",
       [&] { cpu::parallel_sgemm(true, rows, M, M, x.data(), M, w.data(), M, 1.0f, c.data(), M); },
       [&] { cpu::gemm::parallel_multiply(false, true, rows, M, M, x.data(), M, w.data(), M, 1.0f, c.data(), M, allocator); },
       2.0 * rows * M * M},
      {"x^T G (M x 3M, k rows, one)",
       [&] { cpu::k_split_product(M, 3 * M, rows, x.data(), M, x.data(), 3 * M, outs.data(), M, allocator); },
       [&] { cpu::gemm::parallel_multiply(true, false, M, 3 * M, rows, x.data(), M, x.data(), 3 * M, 0.0f, c.data(), 3 * M, allocator); },
       6.0 * rows * M * M},
      // As the layer makes it: one product per weight on the packed path.
      {"x^T G (M x 3M, k rows, layer)",
       [&] { cpu::k_split_product(M, 3 * M, rows, x.data(), M, x.data(), 3 * M, outs.data(), M, allocator); },
       [&] {
         cpu::set_product_path(cpu::ProductPath::packed);
         cpu::layer_weight_product(M, 3 * M, rows, x.data(), M, x.data(), 3 * M, outs.data(), M, allocator);
       },
       6.0 * rows * M * M},
  };
  for (const Shape& s : shapes) {
    double blas = 1e30, packed = 1e30;
    for (int r = 0; r <= reps; ++r) {
      const double b = seconds(s.blas), p = seconds(s.packed);
      if (r > 0) blas = std::min(blas, b), packed = std::min(packed, p);
    }
    std::printf("%-32s openblas %7.1f GFLOP/s   packed %7.1f GFLOP/s   packed/openblas %.2f\n", s.name,
                s.flops / blas * 1e-9, s.flops / packed * 1e-9, blas / packed);
  }
  return 0;
}
