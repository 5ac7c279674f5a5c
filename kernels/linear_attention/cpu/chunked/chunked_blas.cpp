// The chunked form with its per-chunk products on OpenBLAS sgemm: the portable path (builds
// without AVX-512), and the baseline the tiled path is measured against. The mathematics is in
// cpu/chunked/chunked_tiled.hpp's header. The backward recomputes each head's chunk-entry states into a per-thread buffer.
//
// BLAS runs single-threaded inside the head-parallel loop: one level of threading.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/linear_attention/cpu/chunked/chunked_tiled.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"

namespace lattn::cpu {
namespace {

int effective_chunk(const Problem& p) { return std::min(p.chunk, p.seq); }

// A[i][j] *= gamma^(i-j) for j <= i, 0 above the diagonal (n x n, leading dimension ld).
void apply_causal_mask(float* A, int n, int ld, float gamma) {
  for (int i = 0; i < n; ++i) {
    float* row = A + std::size_t(i) * ld;
    if (gamma != 1.0f) {
      float w = 1.0f;
      for (int j = i; j >= 0; --j, w *= gamma) row[j] *= w;
    }
    std::fill(row + i + 1, row + n, 0.0f);
  }
}

// dst[i][:] = scale * gamma^(first + step*i) * src[i][:] for n rows of D.
void scale_rows_by_powers(float* dst, const float* src, int n, int D, float gamma, int first, int step,
                          float scale) {
  for (int i = 0; i < n; ++i) {
    const float w = scale * std::pow(gamma, float(first + step * i));
    const float* in = src + std::size_t(i) * D;
    float* out = dst + std::size_t(i) * D;
    for (int j = 0; j < D; ++j) out[j] = w * in[j];
  }
}

// The forward recurrence over one head's chunks. Writes O (when o != nullptr) and leaves the
// final state in S; with `chunk_states`, stores the state entering each chunk there first.
void forward_head(const Problem& p, float gamma, const float* q, const float* k, const float* v, float* o,
                  float* S, float* chunk_states, float* A, float* scaled) {
  const int T = p.seq, D = p.dim, C = effective_chunk(p);
  const float s = float(attention_scale(D));
  for (int c0 = 0, c = 0; c0 < T; c0 += C, ++c) {
    const int n = std::min(C, T - c0);
    const std::size_t r = std::size_t(c0) * D;
    const float *Qc = q + r, *Kc = k + r, *Vc = v + r;
    if (chunk_states) std::copy_n(S, p.head_state_elems(), chunk_states + std::size_t(c) * D * D);
    if (o) {
      float* Oc = o + r;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, 1.0f, Qc, D, Kc, D, 0.0f, A, C);
      apply_causal_mask(A, n, C, gamma);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, n, s, A, C, Vc, D, 0.0f, Oc, D);
      const float* Qlam = Qc;
      if (gamma != 1.0f) {
        scale_rows_by_powers(scaled, Qc, n, D, gamma, 1, 1, 1.0f);
        Qlam = scaled;
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, D, s, Qlam, D, S, D, 1.0f, Oc, D);
    }
    const float* Kgam = Kc;
    if (gamma != 1.0f) {
      scale_rows_by_powers(scaled, Kc, n, D, gamma, n - 1, -1, 1.0f);
      Kgam = scaled;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, D, n, 1.0f, Kgam, D, Vc, D,
                std::pow(gamma, float(n)), S, D);
  }
}

}  // namespace

std::size_t chunked_blas_forward_floats(const Problem& p) {
  const std::size_t C = std::size_t(effective_chunk(p));
  return C * C + C * p.dim;
}

std::size_t chunked_blas_backward_floats(const Problem& p) {
  const std::size_t C = std::size_t(effective_chunk(p));
  return std::size_t(p.chunks()) * p.head_state_elems() + 2 * C * C + C * p.dim;
}

void chunked_blas_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const int C = effective_chunk(p);
  const long heads_total = long(p.heads_total());
  // One block for all threads, allocated before they start: the counted peak is then the
  // closed form whatever the threads' timing.
  const int threads = head_parallel_threads(p);
  const std::size_t per_thread = chunked_blas_forward_floats(p);
  Workspace<float> scratch(allocator, threads * per_thread);
#pragma omp parallel num_threads(threads)
  {
    float* A = scratch.data() + omp_get_thread_num() * per_thread;
    float* scaled = A + std::size_t(C) * C;
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      float* S = a.hT + st;
      std::copy_n(a.h0 + st, p.head_state_elems(), S);
      forward_head(p, gamma, a.q + tok, a.k + tok, a.v + tok, a.o + tok, S, nullptr, A, scaled);
    }
  }
}

void chunked_blas_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int T = p.seq, D = p.dim, C = effective_chunk(p);
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
  const int threads = head_parallel_threads(p);
  const std::size_t per_thread = chunked_blas_backward_floats(p);
  Workspace<float> scratch(allocator, threads * per_thread);
#pragma omp parallel num_threads(threads)
  {
    struct View {
      float* ptr;
      float* data() const { return ptr; }
    };
    float* base = scratch.data() + omp_get_thread_num() * per_thread;
    const View states{base};
    const View P{states.ptr + std::size_t(p.chunks()) * p.head_state_elems()};
    const View dA{P.ptr + std::size_t(C) * C};
    const View scaled{dA.ptr + std::size_t(C) * C};
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;

      // The final state is not needed: dS is what walks backward. It is parked in dh0's storage
      // and overwritten there by dS = dhT right after.
      float* dS = a.dh0 + st;
      std::copy_n(a.h0 + st, p.head_state_elems(), dS);
      forward_head(p, gamma, q, k, v, nullptr, dS, states.data(), P.data(), scaled.data());
      std::copy_n(a.dhT + st, p.head_state_elems(), dS);

      for (int c = p.chunks() - 1; c >= 0; --c) {
        const int c0 = c * C, n = std::min(C, T - c0);
        const std::size_t r = std::size_t(c0) * D;
        const float *Qc = q + r, *Kc = k + r, *Vc = v + r, *dOc = dO + r;
        float *dQc = a.dq + tok + r, *dKc = a.dk + tok + r, *dVc = a.dv + tok + r;
        const float* S = states.data() + std::size_t(c) * D * D;

        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, 1.0f, Qc, D, Kc, D, 0.0f, P.data(), C);
        apply_causal_mask(P.data(), n, C, gamma);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, D, s, dOc, D, Vc, D, 0.0f, dA.data(), C);
        apply_causal_mask(dA.data(), n, C, gamma);

        // dQ = s diag(lam) dO S^T + dA K
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, D, D, s, dOc, D, S, D, 0.0f, dQc, D);
        if (gamma != 1.0f) scale_rows_by_powers(dQc, dQc, n, D, gamma, 1, 1, 1.0f);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, n, 1.0f, dA.data(), C, Kc, D, 1.0f, dQc, D);

        // dK = diag(gam) V dS^T + dA^T Q
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, D, D, 1.0f, Vc, D, dS, D, 0.0f, dKc, D);
        if (gamma != 1.0f) scale_rows_by_powers(dKc, dKc, n, D, gamma, n - 1, -1, 1.0f);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, n, 1.0f, dA.data(), C, Qc, D, 1.0f, dKc, D);

        // dV = diag(gam) K dS + s P^T dO
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, D, D, 1.0f, Kc, D, dS, D, 0.0f, dVc, D);
        if (gamma != 1.0f) scale_rows_by_powers(dVc, dVc, n, D, gamma, n - 1, -1, 1.0f);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, D, n, s, P.data(), C, dOc, D, 1.0f, dVc, D);

        // dS <- gamma^n dS + s (diag(lam) Q)^T dO, after dK and dV have read the old dS.
        const float* Qlam = Qc;
        if (gamma != 1.0f) {
          scale_rows_by_powers(scaled.data(), Qc, n, D, gamma, 1, 1, 1.0f);
          Qlam = scaled.data();
        }
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, D, D, n, s, Qlam, D, dOc, D,
                    std::pow(gamma, float(n)), dS, D);
      }
    }
  }
}

}  // namespace lattn::cpu
