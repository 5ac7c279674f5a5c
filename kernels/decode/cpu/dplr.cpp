// The decode step of the diagonal-plus-low-rank rule (`rule: dplr`, docs/spec.md sections 1d and 1f) on
// the CPU, float32, OpenMP over the step's value heads: per token, u = S^T b (a read walk over the
// state's rows), then one walk that writes S_i <- A_i S_i + a_i u + k_i v and reads out o = s S^T q.
// The inner loops run over a row's Dv contiguous columns (vectorised by the compiler). A head's state
// (64 KiB at Dk = Dv = 128) stays in the core's L2 between the two walks and the step's tokens, so
// memory sees it read once and written once per step. A pooled step finds each sequence's states at
// its slot (problem.hpp, state_offset); a bf16 state is widened into the thread's float32 copy,
// stepped over all of the step's tokens and rounded to bf16 once (docs/spec.md section 1d).
// kernels/decode/cpu.cpp's decode_step hands dplr problems here; the float64 reference is
// kernels/decode/reference.cpp.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/simd.hpp"
#include "kernels/decode/cpu.hpp"

namespace lattn::cpu {

std::size_t decode_dplr_thread_floats(const DecodeProblem& p) {
  // u, y (Dv each), the decay (Dk), and a bf16 state's float32 copy.
  return 2 * std::size_t(p.value_dim()) + std::size_t(p.dim) + (p.state_bf16 ? p.head_state_elems() : 0);
}

void decode_step_dplr(const DecodeProblem& p, const DecodeArgs<float>& args, Allocator& allocator) {
  const int Dk = p.dim, Dv = p.value_dim(), T = p.tokens, extra = p.extra_slots();
  const std::size_t DD = p.head_state_elems(), per_thread = decode_dplr_thread_floats(p);
  const float s = float(attention_scale(Dk));
  const long heads = long(p.heads_total());
  const int threads = omp_get_max_threads();  // as decode_step_workspace_bytes counts them
  Workspace<float> scratch(allocator, std::size_t(threads) * per_thread);
#pragma omp parallel num_threads(threads)
  {
    float* u = scratch.data() + std::size_t(omp_get_thread_num()) * per_thread;
    float* y = u + Dv;
    float* decay = y + Dv;
    float* widened = decay + Dk;
#pragma omp for schedule(static)
    for (long item = 0; item < heads; ++item) {
      const std::size_t bh = std::size_t(item), at = p.state_offset(bh, args.state_index);
      const float gamma = float(decay_gamma(p.decay, int(bh % std::size_t(p.heads))));
      float* S = p.state_bf16 ? widened : args.state + at;
      if (p.state_bf16)
        for (std::size_t e = 0; e < DD; ++e) S[e] = simd::widen_bf16(args.state_bf16[at + e]);
      for (int t = 0; t < T; ++t) {
        const std::size_t key_row = (p.key_head(bh) * T + std::size_t(t)) * std::size_t(Dk);
        const std::size_t token = bh * T + std::size_t(t), low_row = token * std::size_t(Dk);
        const float *q = args.q + key_row, *k = args.k + key_row, *v = args.v + token * std::size_t(Dv);
        const float *a = args.a + low_row, *b = args.b + low_row;
        for (int i = 0; i < Dk; ++i)
          decay[i] = p.decay == Decay::vector   ? exp_nonpositive(args.g[low_row + std::size_t(i)])
                     : p.decay == Decay::scalar ? exp_nonpositive(args.g[token])
                                                : gamma;
        std::fill_n(u, Dv, 0.0f);
        for (int i = 0; i < Dk; ++i) {  // u = S^T b
          const float* __restrict row = S + std::size_t(i) * Dv;
          float* __restrict uu = u;
          const float bi = b[i];
#pragma omp simd
          for (int j = 0; j < Dv; ++j) uu[j] += bi * row[j];
        }
        std::fill_n(y, Dv, 0.0f);
        for (int i = 0; i < Dk; ++i) {  // S_i <- A_i S_i + a_i u + k_i v; y += s q_i S_i
          float* __restrict row = S + std::size_t(i) * Dv;
          const float *__restrict uu = u, *__restrict vv = v;
          float* __restrict yy = y;
          const float di = decay[i], ai = a[i], ki = k[i], qi = s * q[i];
#pragma omp simd
          for (int j = 0; j < Dv; ++j) {
            const float r = di * row[j] + ai * uu[j] + ki * vv[j];
            row[j] = r;
            yy[j] += qi * r;
          }
        }
        std::copy_n(y, Dv, args.o + token * std::size_t(Dv));
        // Slot i (1..extra) is the state i tokens before the step's end.
        const int slot = T - 1 - t;
        if (slot >= 1 && slot <= extra) std::copy_n(S, DD, args.snapshots + (bh * extra + std::size_t(slot - 1)) * DD);
      }
      if (p.state_bf16)
        for (std::size_t e = 0; e < DD; ++e) args.state_bf16[at + e] = simd::round_bf16(S[e]);
    }
  }
}

}  // namespace lattn::cpu
