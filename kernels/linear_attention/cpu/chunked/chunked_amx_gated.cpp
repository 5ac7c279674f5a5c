// The additive rule with vector gates (GLA) in the chunked form on bf16 token tensors, forward and
// backward, every big product on AMX tiles (the `chunked_amx_gated` row of cpu/bf16_variants.cpp):
// the hardware's tiles or the emulation's (kernels/cpu/amx.hpp), every shape of docs/spec.md
// section 1c, any Dk, Dv and chunk up to 256 (operands zero-padded to whole tiles).
//
// The maths is the float32 kernel's (cpu/chunked/chunked_gated.cpp). Per chunk of n rows entering
// with the float32 state S, b_i the gates cumulated from the chunk's start per key channel, in
// double:
//   O_i    = s ( (q_i . exp(b_i)) S + sum_{j <= i} A_ij v_j ),  A_ij = q_i . exp(b_i - b_j) . k_j
//   S_next = diag(exp(b_{n-1})) S + (K . exp(b_{n-1} - b))^T V
// with A sub-chunked by kGateSubChunk = 32 rows as the float32 kernel does (cpu/chunked/
// chunked_amx_tiles.hpp: between sub-chunks tile products of Q . exp(b - r_I) by K . exp(e_J - b) .
// exp(r_I - e_J); within one a float32 sum with a running product of exp(g)).
//
// Where the gate factors go. Every factor is exp of a difference <= 0 formed in double, and each is
// applied in float32 to an operand before it is rounded to bf16 (Q . exp(b), K . exp(b_{n-1} - b),
// the sub-chunks' Qh and Kb . f_IJ), never as exp(b_i) exp(-b_j) split across the two sides: a
// factor <= 1 on a bf16 operand keeps its 8-bit relative precision (bf16 has float32's exponent
// range), so the product's relative error stays the bf16 roundings' (~2^-9 per operand, averaged
// over the reduction), while the split form overflows float32 past a chunk's gate sum of -88
// (gate_norm 1 reaches -50 to -100 over 128 tokens). Applying the factors to the float32 results
// instead would need them per (row, column, channel) inside the reduction, which no product takes.
// Rounded to bf16 as operands only: Q . exp(b), K . exp(b_{n-1} - b), Qh, Kb . f, s A (for A V), the
// state S (for Q S) and V; S, O and every sum stay float32.
//
// Backward, walking the chunks in reverse with dS the gradient of the state leaving the chunk (the
// entering states recomputed first by a sweep of the state products, kept per chunk in the thread's
// scratch):
//   P  = s A,  dA = s (dO V^T) on and below the diagonal
//   dV = P^T dO + (K . exp(b_{n-1} - b)) dS
//   dQ = exp(b) . s (dO S^T) + the scores' Q side of dA,  dK = exp(b_{n-1} - b) . (V dS^T) + their K side
//   dS <- diag(exp(b_{n-1})) dS + s (Q . exp(b))^T dO
//   dg_i = rowsum(dS_c . S_c) - sum_{tau < i} (q_tau . dq_tau - k_tau . dk_tau)
// (dS_c, S_c: the chunk's entering state and its gradient), with this value head's own dq and dk
// rows; the backward's items are GradParts' (sequence, q/k head, part), a part's value heads in
// order, the first writing dq and dk and the rest adding.
#include <omp.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/linear_attention/cpu/chunked/chunked_amx_tiles.hpp"

namespace lattn::cpu {
namespace {

using namespace amx_tiles;

// One thread's buffers; with base null, carve only counts.
struct Buffers {
  double *b, *sums;
  float *q, *k, *v, *EB, *EL, *QG, *KG, *A, *S, *tmp, *decay, *score, *pack;
  float *dO, *dA, *dS, *dq, *dk, *states;
  std::size_t used;
};

Buffers carve(const Problem& p, float* base, bool backward) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, Dv = p.value_dim(), X = std::max({C, Dk, Dv});
  Buffers b{};
  BlockCarver block{base};
  b.b = block.take_doubles(C * Dk);
  b.sums = block.take_doubles(backward ? Dk : 0);
  for (float** x : {&b.q, &b.k, &b.EB, &b.EL, &b.QG, &b.KG}) *x = block.take(C * Dk);
  b.v = block.take(C * Dv);
  b.A = block.take(C * C);
  b.S = block.take(Dk * Dv);
  b.tmp = block.take(C * X);
  b.decay = block.take(Dk);
  b.score = block.take(ScoreWork::floats(p));
  b.pack = block.take(Packing::words(product_dim(p)));
  if (backward) {
    b.dO = block.take(C * Dv);
    b.dA = block.take(C * C);
    b.dS = block.take(Dk * Dv);
    for (float** x : {&b.dq, &b.dk}) *x = block.take(C * Dk);
    b.states = block.take(std::size_t(max_chunks(p)) * Dk * Dv);
  }
  b.used = block.floats();
  return b;
}

template <class Tiles>
struct Walker {
  const Problem& p;
  const Buffers& B;
  ScoreWork sw;
  Packing pk;
  int C, Dk, Dv;
  float scale;

  Walker(const Problem& p_, const Buffers& B_)
      : p(p_),
        B(B_),
        sw(B_.score, p_),
        pk(B_.pack, product_dim(p_)),
        C(effective_chunk(p_)),
        Dk(p_.dim),
        Dv(p_.value_dim()),
        scale(float(attention_scale(p_.dim))) {}

  // A chunk's rows and gates: q, k, v widened, b, the sub-chunk factors, EB = exp(b), EL =
  // exp(b_{n-1} - b), QG = Q . EB, KG = K . EL, decay = exp(b_{n-1}).
  Gates load(int n, const Bf16* q, const Bf16* k, const Bf16* v, const float* g) const {
    widen_rows(q, n, n, Dk, B.q);
    widen_rows(k, n, n, Dk, B.k);
    widen_rows(v, n, n, Dv, B.v);
    const Gates gates = cumulate(n, Dk, g, 0.0, B.b);
    gate_factors(gates, Dk, sw);
    chunk_factors(gates, Dk, B.EB, B.EL, B.decay);
    multiply_into(B.QG, B.q, B.EB, n * Dk);
    multiply_into(B.KG, B.k, B.EL, n * Dk);
    return gates;
  }

  // S = diag(decay) S + KG^T V.
  void advance(float* S, int n) const {
    for (int d = 0; d < Dk; ++d)
      for (int e = 0; e < Dv; ++e) S[std::size_t(d) * Dv + e] *= B.decay[d];
    product<Tiles>(pk, Dk, Dv, n, cols(B.KG, Dk), rows(B.v, Dv), S, Dv, 1.0f, true);
  }

  void forward_item(const Bf16ForwardArgs& a, const HeadSlice& item) const {
    std::copy_n(a.h0 + item.state, std::size_t(Dk) * Dv, B.S);
    for (int c0 = 0; c0 < item.seq; c0 += C) {
      const int n = std::min(C, item.seq - c0);
      const Gates g = load(n, a.q + item.key + std::size_t(c0) * Dk, a.k + item.key + std::size_t(c0) * Dk,
                           a.v + item.value + std::size_t(c0) * Dv, a.g + item.gate + std::size_t(c0) * Dk);
      gated_scores<Tiles>(pk, sw, g, Dk, B.q, B.k, false, scale, B.A, C);  // s A
      float* o = a.o + item.value + std::size_t(c0) * Dv;
      product<Tiles>(pk, n, Dv, Dk, rows(B.QG, Dk), rows(B.S, Dv), o, Dv, scale, false);
      for (int m0 = 0; m0 < n; m0 += kSub) {
        const int m1 = std::min(n, m0 + kSub);
        product<Tiles>(pk, m1 - m0, Dv, m1, rows(B.A + std::size_t(m0) * C, C), rows(B.v, Dv),
                       o + std::size_t(m0) * Dv, Dv, 1.0f, true);
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
      load(n, a.q + item.key + std::size_t(c0) * Dk, a.k + item.key + std::size_t(c0) * Dk,
           a.v + item.value + std::size_t(c0) * Dv, a.g + item.gate + std::size_t(c0) * Dk);
      std::copy_n(B.states + c * SF, SF, B.states + (c + 1) * SF);
      advance(B.states + (c + 1) * SF, n);
    }
    std::copy_n(a.dhT + item.state, SF, B.dS);
    for (int c = chunks - 1; c >= 0; --c) {
      const int c0 = c * C, n = std::min(C, item.seq - c0);
      const float* S = B.states + c * SF;
      const Gates g = load(n, a.q + item.key + std::size_t(c0) * Dk, a.k + item.key + std::size_t(c0) * Dk,
                           a.v + item.value + std::size_t(c0) * Dv, a.g + item.gate + std::size_t(c0) * Dk);
      widen_rows(a.dO + item.value + std::size_t(c0) * Dv, n, n, Dv, B.dO);
      gated_scores<Tiles>(pk, sw, g, Dk, B.q, B.k, false, scale, B.A, C);  // P = s A
      for (int m0 = 0; m0 < n; m0 += kSub) {                              // dA = s dO V^T, lower
        const int m1 = std::min(n, m0 + kSub);
        product<Tiles>(pk, m1 - m0, m1, Dv, rows(B.dO + std::size_t(m0) * Dv, Dv), cols(B.v, Dv),
                       B.dA + std::size_t(m0) * C, C, scale, false);
      }
      for (int i = 0; i < n; ++i) std::fill(B.dA + std::size_t(i) * C + i + 1, B.dA + std::size_t(i) * C + n, 0.0f);

      // dV = P^T dO + KG dS.
      float* dv = a.dv + item.value + std::size_t(c0) * Dv;
      product<Tiles>(pk, n, Dv, Dk, rows(B.KG, Dk), rows(B.dS, Dv), dv, Dv, 1.0f, false);
      product<Tiles>(pk, n, Dv, n, cols(B.A, C), rows(B.dO, Dv), dv, Dv, 1.0f, true);

      // dQ = EB . s (dO S^T) + dA's Q side; dK = EL . (V dS^T) + its K side.
      product<Tiles>(pk, n, Dk, Dv, rows(B.dO, Dv), cols(S, Dv), B.dq, Dk, scale, false);
      product<Tiles>(pk, n, Dk, Dv, rows(B.v, Dv), cols(B.dS, Dv), B.dk, Dk, 1.0f, false);
      for (int e = 0; e < n * Dk; ++e) {
        B.dq[e] *= B.EB[e];
        B.dk[e] *= B.EL[e];
      }
      score_grads<Tiles>(pk, sw, g, Dk, B.q, B.k, B.dA, C, B.dq, B.dk, B.tmp);

      // dS entering the chunk, then dg from it and S entering.
      for (int d = 0; d < Dk; ++d)
        for (int e = 0; e < Dv; ++e) B.dS[std::size_t(d) * Dv + e] *= B.decay[d];
      product<Tiles>(pk, Dk, Dv, n, cols(B.QG, Dk), rows(B.dO, Dv), B.dS, Dv, scale, true);
      for (int d = 0; d < Dk; ++d) {
        double sum = 0;
        for (int e = 0; e < Dv; ++e) sum += double(B.dS[std::size_t(d) * Dv + e]) * S[std::size_t(d) * Dv + e];
        B.sums[d] = sum;
      }
      float* dg = a.dg + item.gate + std::size_t(c0) * Dk;
      for (int i = 0; i < n; ++i)
        for (int d = 0; d < Dk; ++d) {
          const std::size_t o = std::size_t(i) * Dk + d;
          dg[o] = float(B.sums[d]);
          B.sums[d] -= double(B.q[o]) * B.dq[o] - double(B.k[o]) * B.dk[o];
        }

      float* dq = dq_item + std::size_t(c0) * Dk;
      float* dk = dk_item + std::size_t(c0) * Dk;
      for (int e = 0; e < n * Dk; ++e) {
        dq[e] = accumulate ? dq[e] + B.dq[e] : B.dq[e];
        dk[e] = accumulate ? dk[e] + B.dk[e] : B.dk[e];
      }
    }
    std::copy_n(B.dS, SF, a.dh0 + item.state);
  }
};

// The thread's buffers, as the drivers (chunked_amx_tiles.hpp) carve them.
Buffers carve_buffers(const Problem& p, float* base, bool backward) { return carve(p, base, backward); }

}  // namespace

std::optional<std::string> chunked_amx_gated_limits(const Problem& p) { return amx_tiles::limits(p); }

std::size_t chunked_amx_gated_forward_floats(const Problem& p) {
  return std::size_t(forward_threads(p)) * carve(p, nullptr, false).used;
}

std::size_t chunked_amx_gated_backward_floats(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(backward_threads(p)) * carve(p, nullptr, true).used;
}

void chunked_amx_gated_forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator, AmxPath path) {
  if (p.rule != Rule::additive || p.decay != Decay::vector)
    throw std::logic_error("chunked_amx_gated: the additive rule with vector gates only");
  on_path("chunked_amx_gated", path,
          [&](auto tiles) { run_forward<Walker, decltype(tiles)>(p, a, allocator, carve_buffers); });
}

void chunked_amx_gated_backward(const Problem& p, const Bf16BackwardArgs& a, Allocator& allocator, AmxPath path) {
  if (p.rule != Rule::additive || p.decay != Decay::vector)
    throw std::logic_error("chunked_amx_gated: the additive rule with vector gates only");
  on_path("chunked_amx_gated", path,
          [&](auto tiles) { run_backward<Walker, decltype(tiles)>(p, a, allocator, carve_buffers); });
}

}  // namespace lattn::cpu
