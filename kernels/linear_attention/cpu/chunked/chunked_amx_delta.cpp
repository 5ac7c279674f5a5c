// The delta rule in the chunked form on bf16 token tensors, decays none, retnet, scalar and vector
// gates (DeltaNet, Gated DeltaNet, KDA), forward and backward, every big product on AMX tiles (the
// `chunked_amx_delta` row of cpu/bf16_variants.cpp): the hardware's tiles or the emulation's
// (kernels/cpu/amx.hpp), every shape of docs/spec.md section 1c, any Dk, Dv and chunk up to 256
// (operands zero-padded to whole tiles).
//
// The maths is the float32 kernels' (cpu/chunked/chunked_delta_forward.cpp, the WY / UT form). Per
// chunk of n rows entering with the float32 state S, b_i the cumulative log-gates from the chunk's
// start (per key channel for vector gates; 0 for none, (i + 1) ln gamma for retnet), G = exp(b):
//   A_qk[i][m] = q_i . exp(b_i - b_m) . k_m (m <= i),   A_kk[i][m] = k_i . exp(b_i - b_m) . k_m (m < i)
//   T = (I + diag(beta) A_kk)^-1             (forward substitution, float32, once per chunk)
//   E = V - (K . G) S,   W = T diag(beta) E,   O = s ((Q . G) S + A_qk W)
//   S_next = diag(exp(b_{n-1})) S + (K . exp(b_{n-1} - b))^T W
// On AMX tiles (cpu/chunked/chunked_amx_tiles.hpp: float32 operands rounded to bf16 as they are
// packed, float32 accumulation): the scores Q K^T and K K^T (scalar decays: one product and the
// mask exp(b_i - b_m) on its float32 result; vector gates: the gated form's sub-chunks of 32 rows,
// the factors on the operands), (K . G) S, T (diag(beta) E), (Q . G) S, A_qk W and the state's
// (K . exp(b_{n-1} - b))^T W. T, E, W, O and the state stay float32 between the products; the gate
// factors are exp of differences <= 0 formed in double and applied to the operands before they are
// rounded, so strong gates stay finite (as in cpu/chunked/chunked_amx_gated.cpp). At Dk below 4
// every product splits its operands into two bf16 parts (chunked_amx_tiles.hpp's Split), which the
// write's cancellation along each key needs there (Walker's constructor).
//
// Backward (cpu/chunked/chunked_delta_backward.cpp's), walking the chunks in reverse with dS the
// gradient of the state leaving the chunk, the entering states recomputed first by a forward sweep:
//   dW    = s A_qk^T dO + (K . exp(b_{n-1} - b)) dS,   dR = T^T dW
//   dV    = diag(beta) dR,   dbeta_i = E_i . dR_i + sum_{m<i} dM_im A_kk[i][m],   dM = -dR W^T
//   dP_qk = s dO W^T (m <= i),   dP_kk = diag(beta) dM (m < i)
//   dQ    = G . s dO S^T + dP_qk's Q side,   dK_read = G . (-dV S^T) + dP_kk's row side
//   dK_write = exp(b_{n-1} - b) . (W dS^T) + dP_kk's and dP_qk's K sides
//   dS   <- diag(exp(b_{n-1})) dS + s (Q . G)^T dO - (K . G)^T dV
//   dg_i  = rowsum(dS_c . S_c) - sum_{tau < i} (q . dq - k . dK_write + k . dK_read)_tau
// with every product on tiles (dM, dP_qk, T^T dW, the score gradients' products: score_grads) and
// this value head's own dq and dk rows; items are GradParts' as in cpu/chunked/chunked_amx_gated.cpp.
#include <omp.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/linear_attention/cpu/chunked/chunked_amx_tiles.hpp"
#include "kernels/linear_attention/cpu/chunked/unit_lower_inverse.hpp"

namespace lattn::cpu {
namespace {

using namespace amx_tiles;

// One thread's buffers; with base null, carve only counts.
struct Buffers {
  double *b, *sums;
  float *q, *k, *v, *EB, *EL, *QG, *KG, *KL, *Aqk, *Akk, *T, *E, *R, *Wm, *S, *tmp, *decay, *score, *pack;
  float *dO, *dW, *dR, *dM, *dP, *dS, *dq, *dkr, *dkw, *states;
  std::size_t used;
};

Buffers carve(const Problem& p, float* base, bool backward) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, Dv = p.value_dim(), X = std::max({C, Dk, Dv});
  const std::size_t W = p.decay == Decay::vector ? Dk : 1;
  Buffers b{};
  BlockCarver block{base};
  b.b = block.take_doubles(C * W);
  b.sums = block.take_doubles(backward ? Dk : 0);
  for (float** x : {&b.q, &b.k, &b.EB, &b.EL, &b.QG, &b.KG, &b.KL}) *x = block.take(C * Dk);
  b.v = block.take(C * Dv);
  for (float** x : {&b.Aqk, &b.Akk, &b.T}) *x = block.take(C * C);
  for (float** x : {&b.E, &b.R, &b.Wm}) *x = block.take(C * Dv);
  b.S = block.take(Dk * Dv);
  b.tmp = block.take(C * X);
  b.decay = block.take(Dk);
  b.score = block.take(ScoreWork::floats(p));
  b.pack = block.take(Packing::words(product_dim(p)));
  if (backward) {
    for (float** x : {&b.dO, &b.dW, &b.dR}) *x = block.take(C * Dv);
    for (float** x : {&b.dM, &b.dP}) *x = block.take(C * C);
    b.dS = block.take(Dk * Dv);
    for (float** x : {&b.dq, &b.dkr, &b.dkw}) *x = block.take(C * Dk);
    b.states = block.take(std::size_t(max_chunks(p)) * Dk * Dv);
  }
  b.used = block.floats();
  return b;
}

// Key dims below this run every product on split operands (Walker's constructor).
constexpr int kSplitBelowDim = 4;

template <class Tiles>
struct Walker {
  const Problem& p;
  const Buffers& B;
  ScoreWork sw;
  Packing pk;
  int C, Dk, Dv, W;
  float scale;

  Walker(const Problem& p_, const Buffers& B_)
      : p(p_),
        B(B_),
        sw(B_.score, p_),
        pk(B_.pack, product_dim(p_)),
        C(effective_chunk(p_)),
        Dk(p_.dim),
        Dv(p_.value_dim()),
        W(p_.decay == Decay::vector ? p_.dim : 1),
        scale(float(attention_scale(p_.dim))) {
    // At Dk 1 to 3 the write cancels most of the state along each key (S' = (1 - beta) S + beta v k
    // at Dk 1) and no reduction averages the roundings: bf16 operands of the states, W, dW and the
    // scores leave single outputs off by 5-15% (dk, dh0 where the exact sum cancels). There every
    // product splits both operands into two bf16 parts (~16 significant bits), three tile products
    // each instead of one.
    if (p_.dim < kSplitBelowDim) pk.split = Split::both;
  }

  // Chunk c0 of an item: q, k, v widened, the gates and their factors (EB = exp(b), EL =
  // exp(b_{n-1} - b), QG = Q . EB, KG = K . EB, KL = K . EL, decay = exp(b_{n-1})), the scores A_qk
  // and A_kk, T, E, R = diag(beta) E and W = T R.
  Gates chunk(const HeadSlice& item, int c0, int n, const Bf16* q, const Bf16* k, const Bf16* v, const float* g,
              const float* beta, const float* S) const {
    widen_rows(q + item.key + std::size_t(c0) * Dk, n, n, Dk, B.q);
    widen_rows(k + item.key + std::size_t(c0) * Dk, n, n, Dk, B.k);
    widen_rows(v + item.value + std::size_t(c0) * Dv, n, n, Dv, B.v);
    const double log_gamma = p.decay == Decay::retnet ? std::log(decay_gamma(p.decay, item.head)) : 0.0;
    const bool gated = p.decay == Decay::scalar || p.decay == Decay::vector;
    const Gates gates = cumulate(n, W, gated ? g + item.gate + std::size_t(c0) * W : nullptr, log_gamma, B.b);
    gate_factors(gates, Dk, sw);
    chunk_factors(gates, Dk, B.EB, B.EL, B.decay);
    multiply_into(B.QG, B.q, B.EB, n * Dk);
    multiply_into(B.KG, B.k, B.EB, n * Dk);
    multiply_into(B.KL, B.k, B.EL, n * Dk);
    gated_scores<Tiles>(pk, sw, gates, Dk, B.q, B.k, false, 1.0f, B.Aqk, C);
    gated_scores<Tiles>(pk, sw, gates, Dk, B.k, B.k, true, 1.0f, B.Akk, C);
    // T = (I + diag(beta) A_kk)^-1, the float32 kernel's forward substitution.
    const float* bt = beta + item.beta + c0;
    invert_unit_lower(B.Akk, std::size_t(C), bt, n, n, B.T, std::size_t(C));
    // E = V - KG S, R = diag(beta) E, W = T R.
    product<Tiles>(pk, n, Dv, Dk, rows(B.KG, Dk), rows(S, Dv), B.E, Dv, -1.0f, false);
    for (int i = 0; i < n; ++i) {
      float* __restrict e = B.E + std::size_t(i) * Dv;
      float* __restrict r = B.R + std::size_t(i) * Dv;
      const float* __restrict v = B.v + std::size_t(i) * Dv;
      const float b = bt[i];
#pragma omp simd
      for (int x = 0; x < Dv; ++x) {
        e[x] += v[x];
        r[x] = b * e[x];
      }
    }
    for (int m0 = 0; m0 < n; m0 += kSub) {
      const int m1 = std::min(n, m0 + kSub);
      product<Tiles>(pk, m1 - m0, Dv, m1, rows(B.T + std::size_t(m0) * C, C), rows(B.R, Dv),
                     B.Wm + std::size_t(m0) * Dv, Dv, 1.0f, false);
    }
    return gates;
  }

  // S = diag(decay) S + KL^T W.
  void advance(float* S, int n) const {
    for (int d = 0; d < Dk; ++d)
      for (int e = 0; e < Dv; ++e) S[std::size_t(d) * Dv + e] *= B.decay[d];
    product<Tiles>(pk, Dk, Dv, n, cols(B.KL, Dk), rows(B.Wm, Dv), S, Dv, 1.0f, true);
  }

  void forward_item(const Bf16ForwardArgs& a, const HeadSlice& item) const {
    std::copy_n(a.h0 + item.state, std::size_t(Dk) * Dv, B.S);
    for (int c0 = 0; c0 < item.seq; c0 += C) {
      const int n = std::min(C, item.seq - c0);
      chunk(item, c0, n, a.q, a.k, a.v, a.g, a.beta, B.S);
      float* o = a.o + item.value + std::size_t(c0) * Dv;
      product<Tiles>(pk, n, Dv, Dk, rows(B.QG, Dk), rows(B.S, Dv), o, Dv, scale, false);
      for (int m0 = 0; m0 < n; m0 += kSub) {
        const int m1 = std::min(n, m0 + kSub);
        product<Tiles>(pk, m1 - m0, Dv, m1, rows(B.Aqk + std::size_t(m0) * C, C), rows(B.Wm, Dv),
                       o + std::size_t(m0) * Dv, Dv, scale, true);
      }
      advance(B.S, n);
    }
    std::copy_n(B.S, std::size_t(Dk) * Dv, a.hT + item.state);
  }

  // One value head's backward; dq, dk: its q/k rows' destination (added to where `accumulate`).
  void backward_item(const Bf16BackwardArgs& a, const HeadSlice& item, float* dq_item, float* dk_item,
                     bool accumulate) const {
    const std::size_t SF = std::size_t(Dk) * Dv;
    const int chunks = (item.seq + C - 1) / C;
    std::copy_n(a.h0 + item.state, SF, B.states);
    for (int c = 0; c + 1 < chunks; ++c) {
      const int c0 = c * C, n = std::min(C, item.seq - c0);
      chunk(item, c0, n, a.q, a.k, a.v, a.g, a.beta, B.states + c * SF);
      std::copy_n(B.states + c * SF, SF, B.states + (c + 1) * SF);
      advance(B.states + (c + 1) * SF, n);
    }
    std::copy_n(a.dhT + item.state, SF, B.dS);
    for (int c = chunks - 1; c >= 0; --c) {
      const int c0 = c * C, n = std::min(C, item.seq - c0);
      const float* S = B.states + c * SF;
      const Gates g = chunk(item, c0, n, a.q, a.k, a.v, a.g, a.beta, S);
      const float* bt = a.beta + item.beta + c0;
      widen_rows(a.dO + item.value + std::size_t(c0) * Dv, n, n, Dv, B.dO);

      // dW = s A_qk^T dO + KL dS; dR = T^T dW; dV = diag(beta) dR.
      product<Tiles>(pk, n, Dv, n, cols(B.Aqk, C), rows(B.dO, Dv), B.dW, Dv, scale, false);
      product<Tiles>(pk, n, Dv, Dk, rows(B.KL, Dk), rows(B.dS, Dv), B.dW, Dv, 1.0f, true);
      product<Tiles>(pk, n, Dv, n, cols(B.T, C), rows(B.dW, Dv), B.dR, Dv, 1.0f, false);
      float* dv = a.dv + item.value + std::size_t(c0) * Dv;
      for (int i = 0; i < n; ++i)
        for (int e = 0; e < Dv; ++e) dv[std::size_t(i) * Dv + e] = bt[i] * B.dR[std::size_t(i) * Dv + e];

      // dM = -dR W^T, dbeta, dP_kk = diag(beta) dM (strictly lower); dP_qk = s dO W^T (lower).
      product<Tiles>(pk, n, n, Dv, rows(B.dR, Dv), cols(B.Wm, Dv), B.dM, C, -1.0f, false);
      product<Tiles>(pk, n, n, Dv, rows(B.dO, Dv), cols(B.Wm, Dv), B.dP, C, scale, false);
      float* dbeta = a.dbeta + item.beta + c0;
      for (int i = 0; i < n; ++i) {
        float* dMi = B.dM + std::size_t(i) * C;
        double sum = 0;
        for (int e = 0; e < Dv; ++e) sum += double(B.E[std::size_t(i) * Dv + e]) * B.dR[std::size_t(i) * Dv + e];
        for (int m = 0; m < i; ++m) {
          sum += double(dMi[m]) * B.Akk[std::size_t(i) * C + m];
          dMi[m] *= bt[i];
        }
        std::fill(dMi + i, dMi + n, 0.0f);
        std::fill(B.dP + std::size_t(i) * C + i + 1, B.dP + std::size_t(i) * C + n, 0.0f);
        dbeta[i] = float(sum);
      }

      // dQ = EB . s (dO S^T); dK_read = EB . (-dV S^T); dK_write = EL . (W dS^T); then the scores'.
      product<Tiles>(pk, n, Dk, Dv, rows(B.dO, Dv), cols(S, Dv), B.dq, Dk, scale, false);
      product<Tiles>(pk, n, Dk, Dv, rows(dv, Dv), cols(S, Dv), B.dkr, Dk, -1.0f, false);
      product<Tiles>(pk, n, Dk, Dv, rows(B.Wm, Dv), cols(B.dS, Dv), B.dkw, Dk, 1.0f, false);
      for (int e = 0; e < n * Dk; ++e) {
        B.dq[e] *= B.EB[e];
        B.dkr[e] *= B.EB[e];
        B.dkw[e] *= B.EL[e];
      }
      score_grads<Tiles>(pk, sw, g, Dk, B.q, B.k, B.dP, C, B.dq, B.dkw, B.tmp);
      score_grads<Tiles>(pk, sw, g, Dk, B.k, B.k, B.dM, C, B.dkr, B.dkw, B.tmp);

      // dS entering the chunk: diag(decay) dS + s QG^T dO - KG^T dV.
      for (int d = 0; d < Dk; ++d)
        for (int e = 0; e < Dv; ++e) B.dS[std::size_t(d) * Dv + e] *= B.decay[d];
      product<Tiles>(pk, Dk, Dv, n, cols(B.QG, Dk), rows(B.dO, Dv), B.dS, Dv, scale, true);
      product<Tiles>(pk, Dk, Dv, n, cols(B.KG, Dk), rows(dv, Dv), B.dS, Dv, -1.0f, true);

      if (p.decay == Decay::scalar || p.decay == Decay::vector) {
        for (int d = 0; d < Dk; ++d) {
          double sum = 0;
          for (int e = 0; e < Dv; ++e) sum += double(B.dS[std::size_t(d) * Dv + e]) * S[std::size_t(d) * Dv + e];
          B.sums[d] = sum;
        }
        float* dg = a.dg + item.gate + std::size_t(c0) * W;
        for (int i = 0; i < n; ++i) {
          double total = 0;
          for (int d = 0; d < Dk; ++d) {
            const std::size_t o = std::size_t(i) * Dk + d;
            if (W > 1) dg[o] = float(B.sums[d]);
            total += B.sums[d];
            B.sums[d] -= double(B.q[o]) * B.dq[o] - double(B.k[o]) * B.dkw[o] + double(B.k[o]) * B.dkr[o];
          }
          if (W == 1) dg[i] = float(total);
        }
      }

      float* dq = dq_item + std::size_t(c0) * Dk;
      float* dk = dk_item + std::size_t(c0) * Dk;
      for (int e = 0; e < n * Dk; ++e) {
        const float dke = B.dkr[e] + B.dkw[e];
        dq[e] = accumulate ? dq[e] + B.dq[e] : B.dq[e];
        dk[e] = accumulate ? dk[e] + dke : dke;
      }
    }
    std::copy_n(B.dS, SF, a.dh0 + item.state);
  }
};

// The thread's buffers, as the drivers (chunked_amx_tiles.hpp) carve them.
Buffers carve_buffers(const Problem& p, float* base, bool backward) { return carve(p, base, backward); }

}  // namespace

std::optional<std::string> chunked_amx_delta_limits(const Problem& p) { return amx_tiles::limits(p); }

std::size_t chunked_amx_delta_forward_floats(const Problem& p) {
  return std::size_t(forward_threads(p)) * carve(p, nullptr, false).used;
}

bool chunked_amx_delta_backward_takes(const Problem& p) { return p.rule == Rule::delta; }

std::size_t chunked_amx_delta_backward_floats(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(backward_threads(p)) * carve(p, nullptr, true).used;
}

void chunked_amx_delta_forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator, AmxPath path) {
  if (p.rule != Rule::delta) throw std::logic_error("chunked_amx_delta: the delta rule only");
  on_path("chunked_amx_delta", path,
          [&](auto tiles) { run_forward<Walker, decltype(tiles)>(p, a, allocator, carve_buffers); });
}

void chunked_amx_delta_backward(const Problem& p, const Bf16BackwardArgs& a, Allocator& allocator, AmxPath path) {
  if (p.rule != Rule::delta) throw std::logic_error("chunked_amx_delta: the delta rule only");
  on_path("chunked_amx_delta", path,
          [&](auto tiles) { run_backward<Walker, decltype(tiles)>(p, a, allocator, carve_buffers); });
}

}  // namespace lattn::cpu
