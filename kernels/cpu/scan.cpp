// Scan (recurrent) form on the CPU, float32, forward and backward.
//
// Forward, one pass over the state per token (SPEC section 1):
//   S_t = gamma S_{t-1} + k_t v_t^T,  o_t = s S_t^T q_t
// Row i of S is updated and immediately folded into o_t, so each row is touched once per token
// while it is in L1. The state lives in hT's storage: the forward needs no workspace.
//
// Backward, O(D^2) per head and no per-token state: a forward recurrence rebuilds S_t for
//   dq_t = s S_t do_t,
// then a reverse recurrence carries G_t = gamma G_{t+1} + s q_t do_t^T for
//   dk_t = G_t v_t,  dv_t = G_t^T k_t,  dh0 = gamma G_1.
#include <omp.h>

#include <algorithm>

#include "cpu/kernels.hpp"

namespace lattn::cpu {

int head_parallel_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.heads_total()));
}

std::size_t scan_forward_workspace_bytes(const Problem&) { return 0; }

std::size_t scan_backward_workspace_bytes(const Problem& p) {
  return std::size_t(head_parallel_threads(p)) * p.head_state_elems() * sizeof(float);
}

void scan_forward(const Problem& p, const ForwardArgs<float>& a, Allocator&) {
  const int T = p.seq, D = p.dim;
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
#pragma omp parallel for schedule(static) num_threads(head_parallel_threads(p))
  for (long bh = 0; bh < heads_total; ++bh) {
    const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
    const std::size_t tok = bh * p.head_token_elems();
    const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok;
    float* o = a.o + tok;
    float* S = a.hT + bh * p.head_state_elems();
    std::copy_n(a.h0 + bh * p.head_state_elems(), p.head_state_elems(), S);
    for (int t = 0; t < T; ++t) {
      const float *qt = q + std::size_t(t) * D, *kt = k + std::size_t(t) * D,
                  *vt = v + std::size_t(t) * D;
      float* __restrict ot = o + std::size_t(t) * D;
      std::fill_n(ot, D, 0.0f);
      for (int i = 0; i < D; ++i) {
        float* __restrict row = S + std::size_t(i) * D;
        const float ki = kt[i], qi = qt[i];
#pragma omp simd
        for (int j = 0; j < D; ++j) {
          row[j] = gamma * row[j] + ki * vt[j];
          ot[j] += qi * row[j];
        }
      }
#pragma omp simd
      for (int j = 0; j < D; ++j) ot[j] *= s;
    }
  }
}

void scan_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int T = p.seq, D = p.dim;
  const float s = float(attention_scale(D));
  const long heads_total = long(p.heads_total());
#pragma omp parallel num_threads(head_parallel_threads(p))
  {
    Workspace<float> state(allocator, p.head_state_elems());
    float* __restrict S = state.data();
#pragma omp for schedule(static)
    for (long bh = 0; bh < heads_total; ++bh) {
      const float gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *v = a.v + tok, *dO = a.dO + tok;
      float *dq = a.dq + tok, *dk = a.dk + tok, *dv = a.dv + tok;

      std::copy_n(a.h0 + st, p.head_state_elems(), S);
      for (int t = 0; t < T; ++t) {
        const std::size_t r = std::size_t(t) * D;
        const float *kt = k + r, *vt = v + r, *dot = dO + r;
        for (int i = 0; i < D; ++i) {
          float* __restrict row = S + std::size_t(i) * D;
          const float ki = kt[i];
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int j = 0; j < D; ++j) {
            row[j] = gamma * row[j] + ki * vt[j];
            acc += row[j] * dot[j];
          }
          dq[r + i] = s * acc;
        }
      }

      // G is carried in dh0's storage; after the last step it is scaled into dh0 itself.
      float* __restrict G = a.dh0 + st;
      std::copy_n(a.dhT + st, p.head_state_elems(), G);
      for (int t = T - 1; t >= 0; --t) {
        const std::size_t r = std::size_t(t) * D;
        const float *qt = q + r, *kt = k + r, *vt = v + r, *dot = dO + r;
        float* __restrict dvt = dv + r;
        const float carry = t == T - 1 ? 1.0f : gamma;
        std::fill_n(dvt, D, 0.0f);
        for (int i = 0; i < D; ++i) {
          float* __restrict row = G + std::size_t(i) * D;
          const float sqi = s * qt[i], ki = kt[i];
          float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
          for (int j = 0; j < D; ++j) {
            row[j] = carry * row[j] + sqi * dot[j];
            acc += row[j] * vt[j];
            dvt[j] += ki * row[j];
          }
          dk[r + i] = acc;
        }
      }
      for (std::size_t e = 0; e < p.head_state_elems(); ++e) G[e] *= gamma;
    }
  }
}

}  // namespace lattn::cpu
