// The additive rule's chunked backward on bf16 token tensors with every product on AMX tiles
// (kernels/cpu/amx_gemm.hpp; the backward of the `chunked_amx` row of cpu/bf16_variants.cpp): decays
// none, retnet and scalar gates, every shape of docs/spec.md section 1c; the hardware's tiles or the
// emulation's, as the forward (cpu/chunked/chunked_amx.cpp).
//
// With the forward's notation (chunk of n rows entering with S_c, lam_i = s exp(L_i), gam_j =
// exp(L_{n-1} - L_j), D_ij = s exp(L_i - L_j) for j <= i, 0 above) and dS the gradient of the state
// leaving the chunk, walking the chunks in reverse:
//   P  = D . (Q K^T),  dA = D . (dO V^T)                     (rounded to bf16)
//   dQ = diag(lam) (dO S_c^T) + dA K
//   dK = diag(gam) (V dS^T) + dA^T Q,   dV = diag(gam) (K dS) + P^T dO
//   dS <- exp(L_{n-1}) dS + (diag(lam) Q)^T dO                (dh0: dS after the first chunk)
// Scalar gates' dg: with G_t the gates' running sum over the sequence, o and hT depend on G_t
// through q_t exp(G_t) and k_t exp(-G_t) (and hT on G_T through exp(G_T) as a whole), so
//   dG_t = q_t . dq_t - k_t . dk_t (+ <dhT, hT> at the last token),  dg_u = sum_{t >= u} dG_t
// with this value head's own dq and dk rows (a grouped q/k head's sum over value heads would mix
// heads' gates), and hT from one more step of the state sweep.
// The entering states S_c come first from a forward sweep of the state products alone
// (S_{c+1} = exp(L_{n-1}) S_c + K_w^T V, as the forward computes them), kept per chunk in this
// thread's scratch. Each product is A (row-major bf16) times B (VNNI pairs along the reduction); the
// triangular ones (dA K, dA^T Q, P^T dO) run per 32-row block over the part of the reduction the
// triangle leaves. The states and their gradients stay float32; their bf16 copies feed the products.
// dq and dk of a q/k head sum over its value heads: items are GradParts' (sequence, q/k head, part),
// the part's value heads in order, the first writing dq and dk and the rest adding.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/linear_attention/cpu/chunked/chunk_products.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_amx_parts.hpp"

namespace lattn::cpu {
namespace {

using namespace amx_chunked;

constexpr int kBlock = 2 * amx::kTileRows;

int backward_threads(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(omp_get_max_threads()), parts.items)));
}

// One thread's scratch, in 4-byte words (a bf16 pair or a float32).
struct Buffers {
  std::size_t q, k, v, dO, kt, vt, kp, qp, vp, dop, stp, dstp, dsp, kwt, qlt, scores, dscores, P, PT, dA, dAT, dS, rows,
      decay, states, total;
  explicit Buffers(const Problem& p) {
    const std::size_t C = std::size_t(p.chunk), Dk = std::size_t(p.dim), Dv = std::size_t(p.value_dim());
    const std::size_t chunks = std::size_t(max_chunks(p));
    std::size_t at = 0;
    const auto take = [&at](std::size_t words) {
      const std::size_t here = at;
      at += words;
      return here;
    };
    q = take(C * Dk / 2);  // the chunk's rows as bf16, zero past n: Q, K [C][Dk], V, dO [C][Dv]
    k = take(C * Dk / 2);
    v = take(C * Dv / 2);
    dO = take(C * Dv / 2);
    kt = take(Dk / 2 * C);  // K^T, V^T as pairs along Dk, Dv: [D / 2][C]
    vt = take(Dv / 2 * C);
    kp = take(C / 2 * Dk);  // K, Q, V, dO as pairs of rows: [C / 2][D]
    qp = take(C / 2 * Dk);
    vp = take(C / 2 * Dv);
    dop = take(C / 2 * Dv);
    stp = take(Dv / 2 * Dk);  // S_c^T, dS^T as pairs along Dv: [Dv / 2][Dk]
    dstp = take(Dv / 2 * Dk);
    dsp = take(Dk / 2 * Dv);  // dS as pairs along Dk: [Dk / 2][Dv]
    kwt = take(Dk * C / 2);   // K_w^T, (diag(lam) Q)^T: [Dk][C] bf16
    qlt = take(Dk * C / 2);
    scores = take(C * C);  // Q K^T, dO V^T: [C][C] float32
    dscores = take(C * C);
    P = take(C * C / 2);  // P, P^T, dA, dA^T: [C][C] bf16
    PT = take(C * C / 2);
    dA = take(C * C / 2);
    dAT = take(C * C / 2);
    dS = take(Dk * Dv);                     // dS: [Dk][Dv] float32
    rows = take(C * std::max(Dk, Dv));      // a gradient's rows before they go out: [C][max(Dk, Dv)]
    decay = take(3 * C);                    // L, lam, gam
    states = take((chunks + 1) * Dk * Dv);  // S entering each chunk, and hT (scalar gates' dg)
    total = at;
  }
};

// rows x cols bf16 at `out` (ld `ld`): x's first n rows (ld_x), zero to row `rows`.
void copy_rows(const Bf16* x, int n, int rows, int cols, std::size_t ld_x, Bf16* out, std::size_t ld) {
  for (int r = 0; r < rows; ++r) {
    Bf16* o = out + std::size_t(r) * ld;
    if (r < n)
      std::copy_n(x + std::size_t(r) * ld_x, cols, o);
    else
      std::fill_n(o, cols, Bf16(0));
  }
}

// Pairs of rows: out[r / 2][c] = (x[r][c], x[r + 1][c]) for r < rows (even), x row-major (ld cols).
void pair_rows(const Bf16* x, int rows, int cols, std::uint32_t* out) {
  for (int r = 0; r < rows; r += 2)
    for (int c = 0; c < cols; ++c)
      out[std::size_t(r / 2) * cols + c] = pair_of(x[std::size_t(r) * cols + c], x[std::size_t(r + 1) * cols + c]);
}

// Pairs along the columns, transposed: out[c / 2][r] = (x[r][c], x[r][c + 1]) for r < rows, ld_out.
void pair_columns(const Bf16* x, int rows, int cols, std::uint32_t* out, std::size_t ld_out) {
  for (int c = 0; c < cols; c += 2)
    for (int r = 0; r < rows; ++r)
      out[std::size_t(c / 2) * ld_out + r] = pair_of(x[std::size_t(r) * cols + c], x[std::size_t(r) * cols + c + 1]);
}

// A float32 state (rows x cols) rounded to bf16: as pairs of rows (`by_rows`, out [rows / 2][cols])
// or as pairs along the columns, transposed (out [cols / 2][rows]).
void pair_state(const float* X, int rows, int cols, bool by_rows, std::uint32_t* out) {
  if (by_rows) {
    for (int r = 0; r < rows; r += 2)
      for (int c = 0; c < cols; ++c)
        out[std::size_t(r / 2) * cols + c] =
            pair_of(to_bf16(X[std::size_t(r) * cols + c]), to_bf16(X[std::size_t(r + 1) * cols + c]));
  } else {
    for (int c = 0; c < cols; c += 2)
      for (int r = 0; r < rows; ++r)
        out[std::size_t(c / 2) * rows + r] =
            pair_of(to_bf16(X[std::size_t(r) * cols + c]), to_bf16(X[std::size_t(r) * cols + c + 1]));
  }
}

// x (bf16) . y (float32), n long.
float dot_bf16(const Bf16* x, const float* y, int n) {
  float sum = 0;
  for (int i = 0; i < n; ++i) sum += from_bf16(x[i]) * y[i];
  return sum;
}

// out (n rows, ld `ld`) = or += the buffer's first n rows times w (null: 1).
void rows_out(const float* rows, int n, int cols, const float* w, float* out, std::size_t ld, bool accumulate) {
  for (int r = 0; r < n; ++r) {
    const float* x = rows + std::size_t(r) * cols;
    float* o = out + std::size_t(r) * ld;
    const float f = w ? w[r] : 1.0f;
    if (accumulate)
      for (int c = 0; c < cols; ++c) o[c] += f * x[c];
    else
      for (int c = 0; c < cols; ++c) o[c] = f * x[c];
  }
}

template <class Tiles>
struct Walker {
  const Problem& p;
  const Bf16BackwardArgs& a;
  float* w;
  const Buffers& at;
  int C, Dk, Dv;
  float scale;

  template <class T>
  T* buf(std::size_t offset) const {
    return reinterpret_cast<T*>(w + offset);
  }

  // S entering each chunk of the item, from h0, and with `final` the state leaving the last.
  void states(const HeadSlice& item, float log_gamma, const float* g, bool final) const {
    float* S = w + at.states;
    auto* kwt = buf<Bf16>(at.kwt);
    auto* vp = buf<std::uint32_t>(at.vp);
    auto* vrows = buf<Bf16>(at.v);
    float *L = w + at.decay, *lam = L + C, *gam = lam + C;
    const std::size_t SF = std::size_t(Dk) * Dv;
    std::copy_n(a.h0 + item.state, SF, S);
    const int chunks = (item.seq + C - 1) / C;
    for (int c = 0; c + 1 < chunks + (final ? 1 : 0); ++c) {
      const int c0 = c * C, n = std::min(C, item.seq - c0), n32 = round_up(n, amx::kTileDepth);
      const Bf16* K = a.k + item.key + std::size_t(c0) * Dk;
      const float total = chunk_decays(n, scale, log_gamma, g ? g + c0 : nullptr, L, lam, gam);
      for (int d = 0; d < Dk; ++d) {
        Bf16* row = kwt + std::size_t(d) * C;
        for (int j = 0; j < n; ++j) row[j] = to_bf16(gam[j] * from_bf16(K[std::size_t(j) * Dk + d]));
        std::fill(row + n, row + n32, Bf16(0));
      }
      copy_rows(a.v + item.value + std::size_t(c0) * Dv, n, n32, Dv, std::size_t(Dv), vrows, std::size_t(Dv));
      pair_rows(vrows, n32, Dv, vp);
      float* next = S + SF;
      for (std::size_t x = 0; x < SF; ++x) next[x] = total * S[x];
      amx::gemm<Tiles>(Dk, Dv, n32, kwt, std::size_t(C), vp, std::size_t(Dv), next, std::size_t(Dv), true);
      S = next;
    }
  }

  // One value head's backward; dq, dk: its q/k rows' destination (added to where `accumulate`).
  void head(const HeadSlice& item, float* dq_item, float* dk_item, bool accumulate) const {
    const float log_gamma = log_gamma_of(p, item.head);
    const float* g = p.decay == Decay::scalar ? a.g + item.gate : nullptr;
    float* dG = g ? a.dg + item.gate : nullptr;  // dL_t first, summed from the end at the last
    states(item, log_gamma, g, g != nullptr);
    auto *q = buf<Bf16>(at.q), *k = buf<Bf16>(at.k), *v = buf<Bf16>(at.v), *dO = buf<Bf16>(at.dO);
    auto *kt = buf<std::uint32_t>(at.kt), *vt = buf<std::uint32_t>(at.vt), *kp = buf<std::uint32_t>(at.kp),
         *qp = buf<std::uint32_t>(at.qp), *dop = buf<std::uint32_t>(at.dop), *stp = buf<std::uint32_t>(at.stp),
         *dstp = buf<std::uint32_t>(at.dstp), *dsp = buf<std::uint32_t>(at.dsp);
    auto *qlt = buf<Bf16>(at.qlt), *P = buf<Bf16>(at.P), *PT = buf<Bf16>(at.PT), *dA = buf<Bf16>(at.dA),
         *dAT = buf<Bf16>(at.dAT);
    float *scores = w + at.scores, *dscores = w + at.dscores, *dS = w + at.dS, *rows = w + at.rows;
    float *L = w + at.decay, *lam = L + C, *gam = lam + C;
    const std::size_t SF = std::size_t(Dk) * Dv;
    std::copy_n(a.dhT + item.state, SF, dS);
    const int chunks = (item.seq + C - 1) / C;
    for (int c = chunks - 1; c >= 0; --c) {
      const int c0 = c * C, n = std::min(C, item.seq - c0);
      const int n16 = round_up(n, amx::kTileRows), n32 = round_up(n, amx::kTileDepth);
      const float total = chunk_decays(n, scale, log_gamma, g ? g + c0 : nullptr, L, lam, gam);
      const float* S = w + at.states + std::size_t(c) * SF;

      // The chunk's rows, zero to n32, and their pairings.
      copy_rows(a.q + item.key + std::size_t(c0) * Dk, n, n32, Dk, std::size_t(Dk), q, std::size_t(Dk));
      copy_rows(a.k + item.key + std::size_t(c0) * Dk, n, n32, Dk, std::size_t(Dk), k, std::size_t(Dk));
      copy_rows(a.v + item.value + std::size_t(c0) * Dv, n, n32, Dv, std::size_t(Dv), v, std::size_t(Dv));
      copy_rows(a.dO + item.value + std::size_t(c0) * Dv, n, n32, Dv, std::size_t(Dv), dO, std::size_t(Dv));
      pair_columns(k, n32, Dk, kt, std::size_t(C));
      pair_columns(v, n32, Dv, vt, std::size_t(C));
      pair_rows(k, n32, Dk, kp);
      pair_rows(q, n32, Dk, qp);
      pair_rows(dO, n32, Dv, dop);
      pair_state(S, Dk, Dv, false, stp);
      pair_state(dS, Dk, Dv, false, dstp);
      pair_state(dS, Dk, Dv, true, dsp);
      for (int d = 0; d < Dk; ++d) {
        Bf16* row = qlt + std::size_t(d) * C;
        for (int i = 0; i < n; ++i) row[i] = to_bf16(lam[i] * from_bf16(q[std::size_t(i) * Dk + d]));
        std::fill(row + n, row + n32, Bf16(0));
      }

      // Q K^T and dO V^T on each 32-row block's columns up to its diagonal; then P and dA, zero
      // above the diagonal and past row n, and their transposes.
      for (int m0 = 0; m0 < n16; m0 += kBlock) {
        const int M = std::min(kBlock, n16 - m0), N = std::min(m0 + kBlock, n16);
        amx::gemm<Tiles>(M, N, Dk, q + std::size_t(m0) * Dk, std::size_t(Dk), kt, std::size_t(C),
                         scores + std::size_t(m0) * C, std::size_t(C), false);
        amx::gemm<Tiles>(M, N, Dv, dO + std::size_t(m0) * Dv, std::size_t(Dv), vt, std::size_t(C),
                         dscores + std::size_t(m0) * C, std::size_t(C), false);
      }
      for (int i = 0; i < n32; ++i) {
        Bf16 *prow = P + std::size_t(i) * C, *drow = dA + std::size_t(i) * C;
        const int last = i < n ? i : -1;
        for (int j = 0; j <= last; ++j) {
          const float mask = scale * exp_nonpositive(L[i] - L[j]);
          prow[j] = to_bf16(mask * scores[std::size_t(i) * C + j]);
          drow[j] = to_bf16(mask * dscores[std::size_t(i) * C + j]);
        }
        std::fill(prow + last + 1, prow + n32, Bf16(0));
        std::fill(drow + last + 1, drow + n32, Bf16(0));
      }
      for (int j = 0; j < n32; ++j)
        for (int i = 0; i < n32; ++i) {
          PT[std::size_t(j) * C + i] = P[std::size_t(i) * C + j];
          dAT[std::size_t(j) * C + i] = dA[std::size_t(i) * C + j];
        }

      // dQ = diag(lam) (dO S^T) + dA K, dA K over the columns up to each block's diagonal.
      amx::gemm<Tiles>(n16, Dk, Dv, dO, std::size_t(Dv), stp, std::size_t(Dk), rows, std::size_t(Dk), false);
      for (int i = 0; i < n16; ++i)
        for (int d = 0; d < Dk; ++d) rows[std::size_t(i) * Dk + d] *= i < n ? lam[i] : 0.0f;
      for (int m0 = 0; m0 < n16; m0 += kBlock)
        amx::gemm<Tiles>(std::min(kBlock, n16 - m0), Dk, std::min(m0 + kBlock, n32), dA + std::size_t(m0) * C,
                         std::size_t(C), kp, std::size_t(Dk), rows + std::size_t(m0) * Dk, std::size_t(Dk), true);
      if (dG)
        for (int i = 0; i < n; ++i) dG[c0 + i] = dot_bf16(q + std::size_t(i) * Dk, rows + std::size_t(i) * Dk, Dk);
      rows_out(rows, n, Dk, nullptr, dq_item + std::size_t(c0) * Dk, std::size_t(Dk), accumulate);

      // dK = diag(gam) (V dS^T) + dA^T Q, dV = diag(gam) (K dS) + P^T dO: block j0's reduction runs
      // over the rows i >= j0 only (dA and P are zero above the diagonal).
      amx::gemm<Tiles>(n16, Dk, Dv, v, std::size_t(Dv), dstp, std::size_t(Dk), rows, std::size_t(Dk), false);
      for (int j = 0; j < n16; ++j)
        for (int d = 0; d < Dk; ++d) rows[std::size_t(j) * Dk + d] *= j < n ? gam[j] : 0.0f;
      for (int j0 = 0; j0 < n16; j0 += kBlock)
        amx::gemm<Tiles>(std::min(kBlock, n16 - j0), Dk, n32 - j0, dAT + std::size_t(j0) * C + j0, std::size_t(C),
                         qp + std::size_t(j0 / 2) * Dk, std::size_t(Dk), rows + std::size_t(j0) * Dk, std::size_t(Dk),
                         true);
      if (dG)
        for (int j = 0; j < n; ++j) dG[c0 + j] -= dot_bf16(k + std::size_t(j) * Dk, rows + std::size_t(j) * Dk, Dk);
      rows_out(rows, n, Dk, nullptr, dk_item + std::size_t(c0) * Dk, std::size_t(Dk), accumulate);

      amx::gemm<Tiles>(n16, Dv, Dk, k, std::size_t(Dk), dsp, std::size_t(Dv), rows, std::size_t(Dv), false);
      for (int j = 0; j < n16; ++j)
        for (int e = 0; e < Dv; ++e) rows[std::size_t(j) * Dv + e] *= j < n ? gam[j] : 0.0f;
      for (int j0 = 0; j0 < n16; j0 += kBlock)
        amx::gemm<Tiles>(std::min(kBlock, n16 - j0), Dv, n32 - j0, PT + std::size_t(j0) * C + j0, std::size_t(C),
                         dop + std::size_t(j0 / 2) * Dv, std::size_t(Dv), rows + std::size_t(j0) * Dv, std::size_t(Dv),
                         true);
      rows_out(rows, n, Dv, nullptr, a.dv + item.value + std::size_t(c0) * Dv, std::size_t(Dv), false);

      // dS entering the chunk.
      for (std::size_t x = 0; x < SF; ++x) dS[x] *= total;
      amx::gemm<Tiles>(Dk, Dv, n32, qlt, std::size_t(C), dop, std::size_t(Dv), dS, std::size_t(Dv), true);
    }
    std::copy_n(dS, SF, a.dh0 + item.state);
    if (!dG) return;
    // dg_u = sum_{t >= u} dL_t, with <dhT, hT> in the last token's dL.
    const float* hT = w + at.states + std::size_t(chunks) * SF;
    double run = 0;
    for (std::size_t x = 0; x < SF; ++x) run += double(a.dhT[item.state + x]) * hT[x];
    for (int t = item.seq - 1; t >= 0; --t) {
      run += dG[t];
      dG[t] = float(run);
    }
  }
};

template <class Tiles>
void backward(const Problem& p, const Bf16BackwardArgs& a, Allocator& allocator) {
  const Buffers at(p);
  const GradParts parts(p, omp_get_max_threads());
  const int threads = backward_threads(p);
  Workspace<float> scratch(allocator, parts.partial_floats(p) + std::size_t(threads) * at.total);
  float* partials = scratch.data();
#pragma omp parallel num_threads(threads)
  {
    float* w = scratch.data() + parts.partial_floats(p) + std::size_t(omp_get_thread_num()) * at.total;
    const Walker<Tiles> walk{p, a, w, at, p.chunk, p.dim, p.value_dim(), float(attention_scale(p.dim))};
    amx::configure<Tiles>();
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < long(parts.items); ++i) {
      const GradParts::Item it = parts.item(p, std::size_t(i), a.dq, a.dk, partials);
      for (int h = it.h0; h < it.h1; ++h) {
        const HeadSlice item = p.slice(std::size_t(it.sequence) * p.heads + h);
        walk.head(item, it.dq + item.key, it.dk + item.key, h > it.h0);
      }
    }
    Tiles::release();
    parts.reduce(p, a.dq, a.dk, partials);
  }
}

}  // namespace

bool chunked_amx_backward_takes(const Problem& p) {
  return p.decay == Decay::none || p.decay == Decay::retnet || p.decay == Decay::scalar;
}

std::size_t chunked_amx_backward_floats(const Problem& p) {
  const GradParts parts(p, omp_get_max_threads());
  return parts.partial_floats(p) + std::size_t(backward_threads(p)) * Buffers(p).total;
}

void chunked_amx_backward(const Problem& p, const Bf16BackwardArgs& a, Allocator& allocator, AmxPath path) {
  if (!chunked_amx_backward_takes(p))
    throw std::logic_error("chunked_amx_backward: decays none, retnet and scalar only");
  on_path("chunked_amx", path, [&](auto tiles) { backward<decltype(tiles)>(p, a, allocator); });
}

}  // namespace lattn::cpu
