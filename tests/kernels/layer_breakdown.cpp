// Where the modern block's time goes (docs/performance.md, "Layer block breakdown"): a layer
// config's block run whole on the CPU, then its parts run alone on the same inputs and threads:
//   products  every sgemm the block makes, replayed with the shapes it made them at;
//   streaming the block with its products and linear kernel skipped: the convolution, silu, the
//             layout changes, the L2 norms, the gates and the output norm, each a pass over memory;
//   the same with the linear kernel (the chunked one, states recomputed in fwd_bwd): the kernel's
//             time is the difference, to set beside the kernel suite's (lattnbench --suite kernel).
// Skipped products leave their outputs as the buffers held them, so the passes' values are not the
// layer's; their memory traffic is.
// Not a test: `cmake --build build --target lattn_layer_breakdown`, then
//   build/tests/lattn_layer_breakdown RULE DECAY HEADS HEAD_DIM SEQ CHUNK CONV RANK REPS
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cases.hpp"
#include "kernels/layer/block/block.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"

using namespace lattn;

namespace {

// Freed blocks are kept for the next call of the same size, as the harness's counting allocator
// keeps them: the timings then see no page faults of fresh mappings.
struct HeapAllocator final : Allocator {
  std::multimap<std::size_t, void*> cache;
  std::mutex mutex;  // the kernels take per-thread scratch inside their parallel regions
  void* allocate(std::size_t bytes) override {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = cache.find(bytes); it != cache.end()) {
      void* ptr = it->second;
      cache.erase(it);
      return ptr;
    }
    return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  void deallocate(void* ptr, std::size_t bytes) noexcept override {
    std::lock_guard<std::mutex> lock(mutex);
    cache.emplace(bytes, ptr);
  }
  ~HeapAllocator() override {
    for (auto& [bytes, ptr] : cache) std::free(ptr);
  }
};

struct Product {
  bool weight, trans_b;
  int m, n, k, lda, ldb, ldc;
};

// The CPU block's own operations, each switchable: `products` and `linear` off skip them (their
// outputs keep what the buffers held), and every product's shape is recorded.
struct PartOps {
  Allocator& allocator;
  bool products = true, linear = true;
  std::vector<Product>* record = nullptr;
  Workspace<float> buffer(std::size_t n) { return Workspace<float>(allocator, n); }
  void product(bool tb, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C, int ldc) {
    if (record) record->push_back({false, tb, m, n, k, lda, ldb, ldc});
    if (products) cpu::parallel_sgemm(tb, m, n, k, A, lda, B, ldb, 0.0f, C, ldc);
  }
  void weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C) {
    if (record) record->push_back({true, false, m, n, k, lda, ldb, n});
    float* const outs[1] = {C};
    if (products) cpu::k_split_product(m, n, k, A, lda, B, ldb, outs, n, allocator);
  }
  void linear_forward(const Problem& p, const ForwardArgs<float>& a) {
    if (linear) cpu::chunked_forward(p, a, allocator);
  }
  void linear_backward(const Problem& p, const BackwardArgs<float>& a) {
    if (linear) cpu::chunked_backward(p, a, allocator);
  }
  void window_forward(const Problem&, int, const float*, const float*, const float*, float*, float*) {}
  void window_backward(const Problem&, int, const float*, const float*, const float*, const float*, const float*,
                       const float*, float*, float*, float*) {}
};

double median_ms(int reps, const std::function<void()>& call) {
  call();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s RULE DECAY HEADS HEAD_DIM SEQ CHUNK CONV RANK REPS\n", argv[0]);
    return 2;
  }
  omp_set_num_threads(2);
  LayerProblem p;
  p.linear = Problem{1, std::atoi(argv[3]), std::atoi(argv[5]), std::atoi(argv[4]), std::atoi(argv[6]),
                     decay_from(argv[2]), rule_from(argv[1])};
  p.window = 1;
  p.chunked = true;
  p.keep_chunk_states = false;
  p.block = LayerBlock{std::atoi(argv[7]), true, true, false, std::atoi(argv[8])};
  const int reps = std::atoi(argv[9]);
  HeapAllocator heap;
  for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
    const Case c = test::layer_case(p, mode);
    TensorSet inputs = make_case_inputs(c, 0), outputs = make_case_outputs(c);
    auto get = [&](const char* name) -> float* {
      if (Tensor* t = inputs.find(name)) return t->data.data();
      if (Tensor* t = outputs.find(name)) return t->data.data();
      return nullptr;
    };
    const BlockArgs<float> args = block::bind_args<float>(get);
    const bool backward = mode == Mode::fwd_bwd;
    std::vector<Product> shapes;
    PartOps whole{heap, true, true, &shapes};
    block::run(p, args, whole, backward);
    whole.record = nullptr;
    const double layer = median_ms(reps, [&] { block::run(p, args, whole, backward); });
    PartOps streaming{heap, false, false, nullptr}, with_kernel{heap, false, true, nullptr};
    const double passes = median_ms(reps, [&] { block::run(p, args, streaming, backward); });
    const double passes_kernel = median_ms(reps, [&] { block::run(p, args, with_kernel, backward); });
    std::vector<float> A, B, C;
    std::size_t most = 0;
    for (const Product& s : shapes) most = std::max(most, std::size_t(std::max({s.m, s.n, s.k})) * std::max({s.lda, s.ldb, s.ldc, s.n}));
    A.assign(most, 0.5f), B.assign(most, 0.25f), C.assign(most, 0.0f);
    const double products = median_ms(reps, [&] {
      for (const Product& s : shapes) {
        PartOps o{heap};
        if (s.weight)
          o.weight_product(s.m, s.n, s.k, A.data(), s.lda, B.data(), s.ldb, C.data());
        else
          o.product(s.trans_b, s.m, s.n, s.k, A.data(), s.lda, B.data(), s.ldb, C.data(), s.ldc);
      }
    });
    std::printf("%s %s seq %d %s: layer %.1f ms, products %.1f ms (%zu), streaming passes %.1f ms, passes with the "
                "kernel %.1f ms; layer / (products + passes with the kernel) %.2f\n",
                argv[1], argv[2], p.linear.seq, to_string(mode).c_str(), layer, products, shapes.size(), passes,
                passes_kernel, layer / (products + passes_kernel));
  }
  return 0;
}
