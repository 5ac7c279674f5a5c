// Chunkwise-parallel form on the CPU with the register-tiled AVX-512 products of tile_gemm.hpp,
// float32, forward and backward (the mathematics is in chunked.cpp's header and SPEC section 1).
//
// Per chunk of n rows, forward (S kept packed in panels for the whole head):
//   A    = (Q K^T) . M                    lower output: tiles above the diagonal are not computed
//   O    = s ( diag(lam) (Q S) + A V )    one accumulator, k of A V cut at the tile's last row
//   S    = gamma^n S + K^T (diag(gam) V)
// Backward, after a forward recompute that keeps each chunk's entering state (as S^T panels):
//   P    = s (Q K^T) . M,  dA = s (dO V^T) . M                          (lower outputs)
//   dQ   = diag(s lam) (dO S^T) + dA K                                  (k of dA K: j <= i)
//   dK   = diag(gam) (V dS^T) + dA^T Q,  dV = diag(gam) (K dS) + P^T dO  (k of dA^T Q: j >= i)
//   dS   = gamma^n dS + Q^T (diag(s lam) dO)
// Threads split batch x heads; each thread's scratch is one contiguous block (closed form in
// chunked_tiled_*_floats, held by tests/test_memory.cpp).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>

#include "cpu/chunked_tiled.hpp"
#include "cpu/kernels.hpp"
#include "cpu/tile_gemm.hpp"

namespace lattn::cpu {
namespace {
int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }
using tile::panel_cols;
}  // namespace

std::size_t chunked_tiled_forward_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), D = p.dim, PD = panel_cols(p.dim), PC = panel_cols(int(C));
  return 2 * C * C + D * PC + 2 * C * PD + D * PD + 3 * C + 1;
}

std::size_t chunked_tiled_backward_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), D = p.dim, PD = panel_cols(p.dim), PC = panel_cols(int(C));
  return std::size_t(p.chunks()) * D * PD + 3 * C * C + 2 * D * PC + 4 * C * PD + 3 * D * PD + 3 * C + 1;
}

#if defined(__AVX512F__)
namespace {

using tile::panel_cols;
using tile::Product;
using tile::Range;
using tile::Segment;

// Carves one thread's block into named buffers.
struct Carver {
  float* next;
  float* take(std::size_t n) {
    float* out = next;
    next += n;
    return out;
  }
};

// Powers gamma^0..gamma^C and the causal decay table M[i][j] = gamma^(i-j), 0 above the diagonal.
void decay_tables(float gamma, int C, float* pw, float* mask) {
  pw[0] = 1.0f;
  for (int i = 1; i <= C; ++i) pw[i] = float(std::pow(double(gamma), double(i)));
  for (int i = 0; i < C; ++i)
    for (int j = 0; j < C; ++j) mask[std::size_t(i) * C + j] = j <= i ? pw[i - j] : 0.0f;
}

Segment seg(Range range, int K, const float* a, long ars, long acs, const float* b) {
  Segment s;
  s.range = range;
  s.K = K;
  s.a = a;
  s.ars = ars;
  s.acs = acs;
  s.b = b;
  return s;
}

// S = gamma^n S + K_c^T (diag(gam) V_c), S packed (D x D panels). Vg: scratch panels of n x D.
void update_state(float* Sp, int D, int n, const float* Kc, const float* Vc, const float* gam, float gn, float* Vg) {
  tile::pack(Vc, D, false, n, D, gam, Vg);
  Product u;
  u.M = D;
  u.N = D;
  u.c = Sp;
  u.ldc = tile::kNR;
  u.cps = long(D) * tile::kNR;
  u.beta = gn;
  u.s1 = seg(Range::full, n, Kc, 1, D, Vg);
  tile::run(u);
}

}  // namespace

void chunked_tiled_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const int T = p.seq, D = p.dim, C = effective_chunk(p);
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
  const int threads = head_parallel_threads(p);
  const std::size_t per_thread = chunked_tiled_forward_floats(p);
  Workspace<float> scratch(allocator, threads * per_thread);
#pragma omp parallel num_threads(threads)
  {
    Carver carve{scratch.data() + omp_get_thread_num() * per_thread};
    float* mask = carve.take(std::size_t(C) * C);
    float* A = carve.take(std::size_t(C) * C);
    float* Ktp = carve.take(std::size_t(D) * panel_cols(C));
    float* Vp = carve.take(std::size_t(C) * panel_cols(D));
    float* Vg = carve.take(std::size_t(C) * panel_cols(D));
    float* Sp = carve.take(std::size_t(D) * panel_cols(D));
    float* pw = carve.take(C + 1);
    float* lam = carve.take(C);
    float* gam = carve.take(C);
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, pw, mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      tile::pack(a.h0 + st, D, false, D, D, nullptr, Sp);
      for (int c0 = 0; c0 < T; c0 += C) {
        const int n = std::min(C, T - c0);
        const std::size_t r = std::size_t(c0) * D;
        const float *Qc = a.q + tok + r, *Kc = a.k + tok + r, *Vc = a.v + tok + r;
        for (int i = 0; i < n; ++i) {
          lam[i] = pw[i + 1];
          gam[i] = pw[n - 1 - i];
        }
        tile::pack(Kc, D, true, D, n, nullptr, Ktp);
        tile::pack(Vc, D, false, n, D, nullptr, Vp);

        Product scores;
        scores.M = n;
        scores.N = n;
        scores.c = A;
        scores.ldc = C;
        scores.s1 = seg(Range::full, D, Qc, D, 1, Ktp);
        scores.mask = mask;
        scores.ldm = C;
        scores.mask_all = decay;
        scores.lower = true;
        tile::run(scores);

        Product out;
        out.M = n;
        out.N = D;
        out.c = a.o + tok + r;
        out.ldc = D;
        out.s1 = seg(Range::full, D, Qc, D, 1, Sp);
        out.rs = decay ? lam : nullptr;
        out.s2 = seg(Range::lower, n, A, C, 1, Vp);
        out.alpha = s;
        tile::run(out);

        update_state(Sp, D, n, Kc, Vc, decay ? gam : nullptr, pw[n], Vg);
      }
      tile::unpack(Sp, D, D, a.hT + st, D);
    }
  }
}

void chunked_tiled_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int T = p.seq, D = p.dim, C = effective_chunk(p), chunks = p.chunks();
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
  const int threads = head_parallel_threads(p);
  const std::size_t per_thread = chunked_tiled_backward_floats(p);
  const std::size_t state_panels = std::size_t(D) * panel_cols(D);
  Workspace<float> scratch(allocator, threads * per_thread);
#pragma omp parallel num_threads(threads)
  {
    Carver carve{scratch.data() + omp_get_thread_num() * per_thread};
    float* states = carve.take(chunks * state_panels);  // S^T entering each chunk
    float* mask = carve.take(std::size_t(C) * C);
    float* P = carve.take(std::size_t(C) * C);
    float* dA = carve.take(std::size_t(C) * C);
    float* Ktp = carve.take(std::size_t(D) * panel_cols(C));
    float* Vtp = carve.take(std::size_t(D) * panel_cols(C));
    float* Kp = carve.take(std::size_t(C) * panel_cols(D));
    float* Qp = carve.take(std::size_t(C) * panel_cols(D));
    float* dOp = carve.take(std::size_t(C) * panel_cols(D));
    float* dOl = carve.take(std::size_t(C) * panel_cols(D));
    float* Sp = carve.take(state_panels);
    float* dSp = carve.take(state_panels);
    float* dSTp = carve.take(state_panels);
    float* pw = carve.take(C + 1);
    float* slam = carve.take(C);
    float* gam = carve.take(C);
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const bool decay = gamma != 1.0f;
      decay_tables(gamma, C, pw, mask);
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;

      // Forward recompute of the chunk-entry states, kept as S^T panels (the B of dO S^T).
      tile::pack(a.h0 + st, D, false, D, D, nullptr, Sp);
      for (int c = 0; c < chunks; ++c) {
        const int c0 = c * C, n = std::min(C, T - c0);
        tile::unpack(Sp, D, D, dSTp, D);  // dSTp: a D x D row-major staging buffer here
        tile::pack(dSTp, D, true, D, D, nullptr, states + c * state_panels);
        if (c + 1 == chunks) break;
        for (int i = 0; i < n; ++i) gam[i] = pw[n - 1 - i];
        update_state(Sp, D, n, k + std::size_t(c0) * D, v + std::size_t(c0) * D, decay ? gam : nullptr, pw[n], Kp);
      }

      tile::pack(a.dhT + st, D, false, D, D, nullptr, dSp);
      for (int c = chunks - 1; c >= 0; --c) {
        const int c0 = c * C, n = std::min(C, T - c0);
        const std::size_t r = std::size_t(c0) * D;
        const float *Qc = q + r, *Kc = k + r, *Vc = v + r, *dOc = dO + r;
        for (int i = 0; i < n; ++i) {
          slam[i] = s * pw[i + 1];
          gam[i] = pw[n - 1 - i];
        }
        tile::pack(Kc, D, true, D, n, nullptr, Ktp);
        tile::pack(Vc, D, true, D, n, nullptr, Vtp);
        tile::pack(Kc, D, false, n, D, nullptr, Kp);
        tile::pack(Qc, D, false, n, D, nullptr, Qp);
        tile::pack(dOc, D, false, n, D, nullptr, dOp);
        tile::pack(dOc, D, false, n, D, slam, dOl);
        tile::unpack(dSp, D, D, dSTp, D);
        // dSTp now holds dS row-major; re-pack it transposed in place is not possible, so the
        // transposed panels go to Sp (free during the backward walk).
        tile::pack(dSTp, D, true, D, D, nullptr, Sp);
        const float* dSt = Sp;

        Product scores;
        scores.M = n;
        scores.N = n;
        scores.ldc = C;
        scores.mask = mask;
        scores.ldm = C;
        scores.mask_all = decay;
        scores.lower = true;
        scores.alpha = s;
        scores.c = P;
        scores.s1 = seg(Range::full, D, Qc, D, 1, Ktp);
        tile::run(scores);
        scores.c = dA;
        scores.s1 = seg(Range::full, D, dOc, D, 1, Vtp);
        tile::run(scores);

        Product dq;
        dq.M = n;
        dq.N = D;
        dq.c = a.dq + tok + r;
        dq.ldc = D;
        dq.s1 = seg(Range::full, D, dOc, D, 1, states + c * state_panels);
        dq.rs = slam;
        dq.s2 = seg(Range::lower, n, dA, C, 1, Kp);
        tile::run(dq);

        Product dk = dq;
        dk.c = a.dk + tok + r;
        dk.s1 = seg(Range::full, D, Vc, D, 1, dSt);
        dk.rs = decay ? gam : nullptr;
        dk.s2 = seg(Range::upper, n, dA, 1, C, Qp);
        tile::run(dk);

        Product dv = dk;
        dv.c = a.dv + tok + r;
        dv.s1 = seg(Range::full, D, Kc, D, 1, dSp);
        dv.s2 = seg(Range::upper, n, P, 1, C, dOp);
        tile::run(dv);

        Product ds;
        ds.M = D;
        ds.N = D;
        ds.c = dSp;
        ds.ldc = tile::kNR;
        ds.cps = long(D) * tile::kNR;
        ds.beta = pw[n];
        ds.s1 = seg(Range::full, n, Qc, 1, D, dOl);
        tile::run(ds);
      }
      tile::unpack(dSp, D, D, a.dh0 + st, D);
    }
  }
}

#else
void chunked_tiled_forward(const Problem&, const ForwardArgs<float>&, Allocator&) {
  throw std::logic_error("chunked_tiled_forward: built without AVX-512");
}
void chunked_tiled_backward(const Problem&, const BackwardArgs<float>&, Allocator&) {
  throw std::logic_error("chunked_tiled_backward: built without AVX-512");
}
#endif

}  // namespace lattn::cpu
