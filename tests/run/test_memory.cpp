// temp_mb is counted, not guessed: the counting allocator's own arithmetic, and each CPU kernel's
// measured scratch against its closed form.
#include <catch2/catch.hpp>

#include <omp.h>

#include <utility>

#include "src/run/counting_allocator.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/layer/block/cpu.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/sliding_window/cpu.hpp"
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"
#include "test_util.hpp"

using namespace lattn;

TEST_CASE("the counting allocator tracks live and peak bytes and reuses freed blocks", "[memory]") {
  CountingAllocator allocator;
  void* a = allocator.allocate(1000);
  void* b = allocator.allocate(24);
  CHECK(allocator.live_bytes() == 1024);
  allocator.deallocate(b, 24);
  CHECK(allocator.live_bytes() == 1000);
  CHECK(allocator.peak_bytes() == 1024);
  allocator.reset_peak();
  CHECK(allocator.peak_bytes() == 1000);
  void* c = allocator.allocate(24);
  CHECK(c == b);  // the cached block comes back: no new page faults in timed calls
  allocator.deallocate(c, 24);
  allocator.deallocate(a, 1000);
  CHECK(allocator.live_bytes() == 0);
}

TEST_CASE("each CPU kernel's scratch equals its closed form", "[memory]") {
  omp_set_num_threads(2);
  for (const cpu::Vec vec : cpu::available_vecs()) {
    cpu::set_vec_override(vec);
    for (const Problem& p : {Problem{2, 4, 300, 32, 128, Decay::none}, Problem{1, 1, 50, 8, 64, Decay::retnet},
                             Problem{1, 1, 70, 80, 32, Decay::none}}) {
      INFO(test::describe(p) << " " << cpu::to_string(vec));
      const std::size_t threads = std::min<std::size_t>(2, p.heads_total());
      REQUIRE(std::size_t(cpu::head_parallel_threads(p)) == threads);
      const std::size_t C = std::min(p.chunk, p.seq), D = p.dim, chunks = (p.seq + p.chunk - 1) / p.chunk;

      // The formulas written out here, independently of the kernels' own *_workspace_bytes.
      // scan: items are (head, block of state columns); a packed state per thread, and in the
      // backward also h0^T / dhT^T per head.
      const std::size_t width = cpu::scan_column_block(vec), blocks = (D + width - 1) / width;
      const std::size_t scan_threads = std::min<std::size_t>(2, p.heads_total() * blocks);
      CHECK(cpu::scan_forward_workspace_bytes(p) == scan_threads * D * D * 4);
      CHECK(cpu::scan_backward_workspace_bytes(p) == (p.heads_total() + scan_threads) * D * D * 4);
      if (cpu::chunked_uses_tiles()) {
        // Per thread: decay table and scores (C^2 each), packed panels (width rounded up to 32),
        // the packed state, and gamma powers, lam, gam (3C + 1); the backward's thread has P and
        // dA with a row stride of C + 16 and adds
        // packed K^T V^T K Q dO (s lam dO), S^T, dS, dS^T. With fewer heads than threads the
        // chunks are split over min(threads, chunks) threads and the chunk states are shared
        // (forward: one per chunk + the running one; backward: S and dS per chunk + the running
        // one); otherwise each thread keeps its own head's chunk-entry states in the backward.
        // A forward that keeps every head's chunk states (B * H * chunks packed states, allocated
        // by the caller) needs no chunk states of its own, and neither does the backward given them
        // (split over chunks, it still holds dS per chunk).
        const std::size_t PD = (D + 31) / 32 * 32, PC = (C + 31) / 32 * 32, SF = D * PD;
        const std::size_t fwd_thread = 2 * C * C + D * PC + 2 * C * PD + D * PD + 3 * C + 1;
        const std::size_t bwd_thread = C * C + 2 * C * (C + 16) + 2 * D * PC + 4 * C * PD + 3 * D * PD + 3 * C + 1;
        const bool split = p.heads_total() < 2 && chunks > 1;
        const std::size_t split_threads = std::min<std::size_t>(2, chunks);
        CHECK(cpu::chunked_forward_workspace_bytes(p) ==
              (split ? (chunks + 1) * SF + split_threads * fwd_thread : threads * fwd_thread) * 4);
        CHECK(cpu::chunked_backward_workspace_bytes(p) ==
              (split ? (2 * chunks + 1) * SF + split_threads * bwd_thread : threads * (chunks * SF + bwd_thread)) * 4);
        CHECK(cpu::chunked_kept_states_bytes(p) == p.heads_total() * chunks * SF * 4);
        CHECK(cpu::chunked_forward_workspace_bytes(p, true) ==
              (split ? SF + split_threads * fwd_thread : threads * fwd_thread) * 4);
        CHECK(cpu::chunked_backward_workspace_bytes(p, true) ==
              (split ? (chunks + 1) * SF + split_threads * bwd_thread : threads * bwd_thread) * 4);
      } else {
        CHECK(cpu::chunked_forward_workspace_bytes(p) == threads * (C * C + C * D) * 4);
        CHECK(cpu::chunked_backward_workspace_bytes(p) == threads * (chunks * D * D + 2 * C * C + C * D) * 4);
        CHECK(cpu::chunked_kept_states_bytes(p) == 0);  // the OpenBLAS path recomputes
      }

      const TensorSet t = make_case_inputs(test::kernel_case(p, "scan", Mode::fwd_bwd), 0);
      std::vector<float> o(p.token_elems()), hT(p.state_elems()), dq(p.token_elems()), dk(p.token_elems()),
          dv(p.token_elems()), dh0(p.state_elems());
      const ForwardArgs<float> fwd{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data()};
      const BackwardArgs<float> bwd{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), t.data("dO"),
                                    t.data("dhT"), dq.data(), dk.data(), dv.data(), dh0.data()};
      auto peak_of = [](auto&& call) {
        CountingAllocator allocator;
        call(allocator);
        CHECK(allocator.live_bytes() == 0);
        return allocator.peak_bytes();
      };
      CHECK(peak_of([&](Allocator& a) { cpu::scan_forward(p, fwd, a); }) == cpu::scan_forward_workspace_bytes(p));
      CHECK(peak_of([&](Allocator& a) { cpu::scan_backward(p, bwd, a); }) == cpu::scan_backward_workspace_bytes(p));
      CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fwd, a); }) == cpu::chunked_forward_workspace_bytes(p));
      CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, bwd, a); }) == cpu::chunked_backward_workspace_bytes(p));
      if (cpu::chunked_kept_states_bytes(p) > 0) {
        std::vector<float> kept(cpu::chunked_kept_states_bytes(p) / 4);
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_forward(p, fwd, a, kept.data()); }) ==
              cpu::chunked_forward_workspace_bytes(p, true));
        CHECK(peak_of([&](Allocator& a) { cpu::chunked_backward(p, bwd, a, kept.data()); }) ==
              cpu::chunked_backward_workspace_bytes(p, true));
      }
    }
  }
  cpu::set_vec_override(std::nullopt);
}

TEST_CASE("the backend reports the kernel's scratch as temp and the tensors as arg and out", "[memory]") {
  const Problem p{2, 2, 200, 16, 64, Decay::none};
  auto backend = make_backend("cpu", BackendOptions{2});
  const Case kase = test::kernel_case(p, "chunked", Mode::fwd_bwd);
  const test::Outcome run = test::run_on(*backend, kase, 0);
  const MemoryUsage m = run.memory;
  // A fwd_bwd call holds the chunk states its forward keeps for its backward, where it can keep them.
  const std::size_t kept = cpu::chunked_kept_states_bytes(p);
  CHECK(m.temp_bytes == kept + std::max(cpu::chunked_forward_workspace_bytes(p, kept > 0),
                                        cpu::chunked_backward_workspace_bytes(p, kept > 0)));
  CHECK(run.bwd_states == (kept > 0 ? "kept" : "recomputed"));

  // Asked to recompute them, the call holds the larger of the two passes' own scratch.
  auto recomputing = make_backend("cpu", BackendOptions{2, 0, false});
  const test::Outcome lighter = test::run_on(*recomputing, kase, 0);
  CHECK(lighter.memory.temp_bytes ==
        std::max(cpu::chunked_forward_workspace_bytes(p), cpu::chunked_backward_workspace_bytes(p)));
  CHECK(lighter.bwd_states == "recomputed");
  CHECK(recomputing->find("linear_attention", "chunked")->memory_estimate(kase) <
        backend->find("linear_attention", "chunked")->memory_estimate(kase) + (kept > 0 ? 0 : 1));
  CHECK(m.arg_bytes == (4 * p.token_elems() + 2 * p.state_elems()) * 4);  // q k v dO, h0 dhT
  CHECK(m.out_bytes == (4 * p.token_elems() + 2 * p.state_elems()) * 4);  // o dq dk dv, hT dh0
}

TEST_CASE("the sliding-window kernel's scratch equals its closed form and is O(T * W)", "[memory][window]") {
  for (int threads : {1, 2, 3}) {
    omp_set_num_threads(threads);
    for (const auto& [p, window] : {std::pair{Problem{2, 4, 300, 32, 1, Decay::none}, 50},
                                    std::pair{Problem{1, 1, 200, 16, 1, Decay::none}, 20},
                                    std::pair{Problem{1, 1, 40, 8, 1, Decay::none}, 1000}}) {
      INFO(test::describe(p) << " W" << window << " threads " << threads);
      // Written out independently of the kernel: Bq = min(32, T), tiles of Bq x min(T, Bq + W - 1);
      // the backward cuts a head into segments only when there are fewer heads than threads.
      const std::size_t Bq = std::min(32, p.seq), L = std::min<std::size_t>(p.seq, Bq + window - 1);
      const std::size_t blocks = (p.seq + Bq - 1) / Bq;
      const std::size_t segments = std::min<std::size_t>(blocks, (threads + p.heads_total() - 1) / p.heads_total());
      const std::size_t tasks = p.heads_total() * segments, bwd_threads = std::min<std::size_t>(threads, tasks);
      const std::size_t spill = segments > 1 ? tasks * 2 * std::min<std::size_t>(window - 1, p.seq) * p.dim : 0;
      // With the register-tiled products the forward takes groups of 8 blocks: a tile of Bq x
      // (L + 31) (block key ranges start at multiples of 32) and the Bq rows' 1 / sum, K^T of the
      // group's keys as 32-wide panels, and the group's V rows padded to a panel when D is not a
      // multiple of 32.
      auto round32 = [](std::size_t n) { return (n + 31) / 32 * 32; };
      const std::size_t group_keys = std::min<std::size_t>(p.seq, 8 * Bq + window - 1 + 31);
      const std::size_t tiled_fwd = Bq * (std::min<std::size_t>(p.seq, Bq + window - 1 + 31) + 1) +
                                    p.dim * round32(group_keys) + (p.dim % 32 ? group_keys * round32(p.dim) : 0);
      const std::size_t fwd_tasks = p.heads_total() * (cpu::chunked_uses_tiles() ? (blocks + 7) / 8 : blocks);
      const std::size_t fwd_threads = std::min<std::size_t>(threads, fwd_tasks);
      CHECK(cpu::sliding_window_forward_workspace_bytes(p, window) ==
            fwd_threads * (cpu::chunked_uses_tiles() ? tiled_fwd : Bq * L) * 4);
      const std::size_t bwd_panels = cpu::chunked_uses_tiles() ? p.dim * ((L + 31) / 32 * 32) : 0;  // K^T, then V^T
      CHECK(cpu::sliding_window_backward_workspace_bytes(p, window) ==
            (bwd_threads * (2 * Bq * L + bwd_panels) + spill) * 4);

      const TensorSet t = make_case_inputs(test::window_case(p, window, Mode::fwd_bwd), 0);
      std::vector<float> o(p.token_elems()), lse(p.heads_total() * p.seq), dq(p.token_elems()), dk(p.token_elems()),
          dv(p.token_elems());
      CountingAllocator fwd, bwd;
      cpu::sliding_window_forward(p, window, {t.data("q"), t.data("k"), t.data("v"), o.data(), lse.data()}, fwd);
      cpu::sliding_window_backward(p, window,
                                   {t.data("q"), t.data("k"), t.data("v"), o.data(), lse.data(), t.data("dO"), dq.data(),
                                    dk.data(), dv.data(), false},
                                   bwd);
      CHECK(fwd.peak_bytes() == cpu::sliding_window_forward_workspace_bytes(p, window));
      CHECK(bwd.peak_bytes() == cpu::sliding_window_backward_workspace_bytes(p, window));
      CHECK(fwd.live_bytes() == 0);
      CHECK(bwd.live_bytes() == 0);
    }
  }
  omp_set_num_threads(omp_get_num_procs());
}

namespace {

// Per token a layer's scratch settles to a constant: nothing grows as T^2. The packed products'
// scratch holds op(B) whole only up to 4 MiB and in slabs past it (kernels/cpu/packed_gemm.hpp), so
// where the weight gradients' op(B) (T x the columns) passes that size their share per token falls:
// per token the scratch may shrink a little with T, but never grows, and what the layer keeps
// (O(B T M)) holds it above 0.8 of the shorter figure. per_token(seq, backward) is bytes / T.
template <class PerToken>
void check_scratch_per_token_settles(PerToken per_token) {
  for (bool backward : {false, true})
    for (auto [shorter, longer] : {std::pair{4096, 8192}, std::pair{8192, 65536}}) {
      INFO((backward ? "fwd_bwd" : "fwd") << " per token at T " << shorter << " and " << longer);
      CHECK(per_token(longer, backward) <= 1.05 * per_token(shorter, backward));
      CHECK(per_token(longer, backward) >= 0.8 * per_token(shorter, backward));
    }
}

}  // namespace

TEST_CASE("the layer's scratch equals its closed form and grows linearly in T", "[memory][layer]") {
  omp_set_num_threads(2);
  // The second shape's width (192) against its few rows makes the weight gradients' partial
  // products (blocks x M x 3M) the largest scratch of the backward.
  for (const LayerProblem& shape : {LayerProblem{{1, 2, 300, 16, 64, Decay::none}, 40, false},
                                    LayerProblem{{1, 4, 64, 48, 32, Decay::none}, 16, false}})
  for (bool chunked : {false, true}) {
    LayerProblem p = shape;
    p.chunked = chunked;
    INFO(test::describe(p.linear) << (chunked ? " chunked" : " scan"));
    auto backend = make_backend("cpu", BackendOptions{2});
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      const MemoryUsage m = test::run_on(*backend, test::layer_case(p, mode), 0).memory;
      CHECK(m.temp_bytes == (mode == Mode::fwd ? cpu::layer_forward_workspace_bytes(p)
                                               : cpu::layer_forward_backward_workspace_bytes(p)));
      const std::size_t M = p.model_dim(), N = p.token_elems(), H = std::size_t(p.linear.heads);
      CHECK(m.arg_bytes == (mode == Mode::fwd ? N : 2 * N) * 4 + (4 * M * M + M + H) * 4);  // x (dOut), W, g, beta
      CHECK(m.out_bytes == (mode == Mode::fwd ? N * 4 : (2 * N + 4 * M * M + M + H) * 4));
    }
    check_scratch_per_token_settles([&](int seq, bool backward) {
      LayerProblem q = p;
      q.linear.seq = seq;
      return double(backward ? cpu::layer_forward_backward_workspace_bytes(q) : cpu::layer_forward_workspace_bytes(q)) / seq;
    });
  }
  omp_set_num_threads(omp_get_num_procs());
}

TEST_CASE("the modern block's scratch equals its closed form and grows linearly in T", "[memory][layer][block]") {
  omp_set_num_threads(2);
  std::vector<LayerProblem> shapes = test::block_test_shapes();
  for (const LayerProblem& p : test::rwkv7_test_shapes()) shapes.push_back(p);
  for (const LayerProblem& p : test::mamba3_test_shapes()) shapes.push_back(p);
  for (const LayerProblem& shape : shapes)
    for (bool chunked : {false, true}) {
      LayerProblem p = shape;
      if (p.linear.seq == 1) continue;
      p.chunked = chunked;
      const Case c = test::layer_case(p, Mode::fwd);
      INFO(test::describe(c));
      auto backend = make_backend("cpu", BackendOptions{2});
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        const MemoryUsage m = test::run_on(*backend, test::layer_case(p, mode), 0).memory;
        CHECK(m.temp_bytes == (mode == Mode::fwd ? cpu::block_forward_workspace_bytes(p)
                                                 : cpu::block_forward_backward_workspace_bytes(p)));
      }
      // The conv keeps no history: nothing of it grows with T beyond its rows.
      check_scratch_per_token_settles([&](int seq, bool backward) {
        LayerProblem q = p;
        q.linear.seq = seq;
        return double(backward ? cpu::block_forward_backward_workspace_bytes(q) : cpu::block_forward_workspace_bytes(q)) /
               seq;
      });
    }
  omp_set_num_threads(omp_get_num_procs());
}
