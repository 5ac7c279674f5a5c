// The additive rule's chunked forward on bf16 token tensors with every product on AMX tiles
// (kernels/cpu/amx_gemm.hpp; the `chunked_amx` row of cpu/bf16_variants.cpp). Decays none, retnet
// and scalar gates; every shape of docs/spec.md section 1c (each (sequence, value head) item reads
// its own rows through Problem::slice). The same code runs on the hardware's tiles or on the
// emulation's (kernels/cpu/amx.hpp): the tests prove it through the emulation on any CPU.
//
// The maths is chunked_bf16.cpp's: for a chunk of n rows entering with the float32 state S, L_i
// the summed log-decay of the chunk's tokens 0 .. i, s the attention scale,
//   O_i    = s ( exp(L_i) (Q S)_i + sum_{j <= i} exp(L_i - L_j) (q_i . k_j) v_j )
//   S_next = exp(L_{n-1}) S + sum_j exp(L_{n-1} - L_j) k_j v_j^T
// as four tile products a chunk, each A (row-major bf16) times B (VNNI pairs along the reduction):
//   scores = Q K^T    A: Q as it is (a short chunk's copied, zero rows to a multiple of 16);
//                     B: K's rows' pairs transposed (row p: (K[j][2p], K[j][2p + 1]) for every j)
//   O      = Q S      B: S rounded to bf16 in pairs of rows (the state stays float32 between chunks)
//   O     += P V      A: P = s (scores . decay mask) rounded to bf16; B: V in pairs of rows
//   S     += K_w^T V  A: K_w^T, K_w = diag(exp(L_{n-1} - L_j)) K rounded to bf16; B: V's pairs reused
// scores and P V run per 32-row block over the columns up to its diagonal only. Reductions over the
// chunk's rows are zero-padded to a multiple of 32; O's rows go through a C x Dv buffer, so a short
// last chunk writes only its own rows. Every rounding is to nearest even.
//
// The packing is plain C++ that the compiler vectorises for the build's -march (the AMX hosts' is
// AVX-512): the file is compiled with -mamx-tile -mamx-bf16 besides, where the compiler has them,
// and the AMX instructions run only where the row's check (amx::hardware_refusal) allows.
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_amx_parts.hpp"

namespace lattn::cpu {
namespace {

using namespace amx_chunked;

constexpr int kBlock = 2 * amx::kTileRows;  // rows of a scores / P V block: one 2 x 2 tile block

// One thread's scratch, in 4-byte words (a bf16 pair or a float32).
struct Scratch {
  std::size_t kt, vp, kwt, sp, state, scores, p, q, out, decay, total;
  explicit Scratch(const Problem& p) {
    const std::size_t C = std::size_t(p.chunk), Dk = std::size_t(p.dim), Dv = std::size_t(p.value_dim());
    kt = 0;                    // K^T as pairs: [Dk / 2][C]
    vp = kt + Dk / 2 * C;      // V as pairs: [C / 2][Dv]
    kwt = vp + C / 2 * Dv;     // K_w^T: [Dk][C] bf16
    sp = kwt + Dk * C / 2;     // S as pairs: [Dk / 2][Dv]
    state = sp + Dk / 2 * Dv;  // S: [Dk][Dv] float32
    scores = state + Dk * Dv;  // Q K^T: [C][C] float32
    this->p = scores + C * C;  // P: [C][C] bf16
    q = this->p + C * C / 2;   // a short chunk's Q, zero-padded: [C][Dk] bf16
    out = q + C * Dk / 2;      // O's rows: [C][Dv] float32
    decay = out + C * Dv;      // L_i, s exp(L_i), exp(L_{n-1} - L_i): 3 x C float32
    total = decay + 3 * C;
  }
};

template <class Tiles>
void run_item(const Problem& p, const Bf16ForwardArgs& a, const HeadSlice& item, float* w, const Scratch& at) {
  const int C = p.chunk, Dk = p.dim, Dv = p.value_dim();
  const float scale = float(attention_scale(Dk));
  const float log_gamma = log_gamma_of(p, item.head);
  auto* kt = reinterpret_cast<std::uint32_t*>(w + at.kt);
  auto* vp = reinterpret_cast<std::uint32_t*>(w + at.vp);
  auto* kwt = reinterpret_cast<Bf16*>(w + at.kwt);
  auto* sp = reinterpret_cast<std::uint32_t*>(w + at.sp);
  float* S = w + at.state;
  float* scores = w + at.scores;
  auto* P = reinterpret_cast<Bf16*>(w + at.p);
  auto* qpad = reinterpret_cast<Bf16*>(w + at.q);
  float* obuf = w + at.out;
  float* L = w + at.decay;
  float* lam = L + C;  // s exp(L_i): the inter-chunk term's row scale
  float* gam = lam + C;
  const Bf16* q_item = a.q + item.key;
  const Bf16* k_item = a.k + item.key;
  const Bf16* v_item = a.v + item.value;
  float* o_item = a.o + item.value;
  const float* g_item = p.decay == Decay::scalar ? a.g + item.gate : nullptr;
  const bool weighted = p.decay != Decay::none;
  std::copy_n(a.h0 + item.state, std::size_t(Dk) * Dv, S);

  for (int c0 = 0; c0 < item.seq; c0 += C) {
    const int n = std::min(C, item.seq - c0);
    const int n16 = round_up(n, amx::kTileRows), n32 = round_up(n, amx::kTileDepth);
    const Bf16* K = k_item + std::size_t(c0) * Dk;
    const Bf16* V = v_item + std::size_t(c0) * Dv;
    const Bf16* Q = q_item + std::size_t(c0) * Dk;
    if (n < n16) {
      std::fill_n(qpad, std::size_t(n16) * Dk, Bf16(0));
      std::copy_n(Q, std::size_t(n) * Dk, qpad);
      Q = qpad;
    }

    // Decays: L_i, lam_i = s exp(L_i), gam_j = exp(L_{n-1} - L_j).
    const float total = chunk_decays(n, scale, log_gamma, g_item ? g_item + c0 : nullptr, L, lam, gam);

    // K^T as pairs and K_w^T, zero in the columns n .. n32 - 1.
    for (int pr = 0; pr < Dk / 2; ++pr) {
      std::uint32_t* row = kt + std::size_t(pr) * C;
      for (int j = 0; j < n; ++j)
        row[j] =
            pair_of(K[std::size_t(j) * Dk + 2 * std::size_t(pr)], K[std::size_t(j) * Dk + 2 * std::size_t(pr) + 1]);
      std::fill(row + n, row + n32, 0u);
    }
    for (int d = 0; d < Dk; ++d) {
      Bf16* row = kwt + std::size_t(d) * C;
      if (weighted)
        for (int j = 0; j < n; ++j) row[j] = to_bf16(gam[j] * from_bf16(K[std::size_t(j) * Dk + d]));
      else
        for (int j = 0; j < n; ++j) row[j] = K[std::size_t(j) * Dk + d];
      std::fill(row + n, row + n32, Bf16(0));
    }
    // V as pairs of rows (exact), zero past row n; S as pairs of rows, rounded.
    for (int pr = 0; pr < n32 / 2; ++pr) {
      const int j = 2 * pr;
      std::uint32_t* row = vp + std::size_t(pr) * Dv;
      const Bf16* lo = V + std::size_t(j) * Dv;
      const Bf16* hi = V + std::size_t(j + 1) * Dv;
      if (j + 1 < n)
        for (int e = 0; e < Dv; ++e) row[e] = pair_of(lo[e], hi[e]);
      else if (j < n)
        for (int e = 0; e < Dv; ++e) row[e] = pair_of(lo[e], 0);
      else
        std::fill_n(row, Dv, 0u);
    }
    for (int pr = 0; pr < Dk / 2; ++pr) {
      const float* lo = S + std::size_t(2 * pr) * Dv;
      const float* hi = lo + Dv;
      std::uint32_t* row = sp + std::size_t(pr) * Dv;
      for (int e = 0; e < Dv; ++e) row[e] = pair_of(to_bf16(lo[e]), to_bf16(hi[e]));
    }

    // scores = Q K^T on each 32-row block's columns up to its diagonal; then P = s (scores . mask),
    // zero above the diagonal, in rows n .. n16 - 1 and in columns up to n32.
    for (int m0 = 0; m0 < n16; m0 += kBlock)
      amx::gemm<Tiles>(std::min(kBlock, n16 - m0), std::min(m0 + kBlock, n16), Dk, Q + std::size_t(m0) * Dk,
                       std::size_t(Dk), kt, std::size_t(C), scores + std::size_t(m0) * C, std::size_t(C), false);
    for (int i = 0; i < n16; ++i) {
      Bf16* prow = P + std::size_t(i) * C;
      const float* srow = scores + std::size_t(i) * C;
      const int last = i < n ? i : -1;
      if (weighted)
        for (int j = 0; j <= last; ++j) prow[j] = to_bf16(scale * srow[j] * exp_nonpositive(L[i] - L[j]));
      else
        for (int j = 0; j <= last; ++j) prow[j] = to_bf16(scale * srow[j]);
      std::fill(prow + last + 1, prow + n32, Bf16(0));
    }

    // O = diag(lam) Q S + P V, each 32-row block of P V over the columns up to its diagonal.
    amx::gemm<Tiles>(n16, Dv, Dk, Q, std::size_t(Dk), sp, std::size_t(Dv), obuf, std::size_t(Dv), false);
    for (int i = 0; i < n16; ++i) {
      float* row = obuf + std::size_t(i) * Dv;
      const float l = i < n ? lam[i] : 0.0f;
      for (int e = 0; e < Dv; ++e) row[e] *= l;
    }
    for (int m0 = 0; m0 < n16; m0 += kBlock)
      amx::gemm<Tiles>(std::min(kBlock, n16 - m0), Dv, std::min(m0 + kBlock, n32), P + std::size_t(m0) * C,
                       std::size_t(C), vp, std::size_t(Dv), obuf + std::size_t(m0) * Dv, std::size_t(Dv), true);
    std::copy_n(obuf, std::size_t(n) * Dv, o_item + std::size_t(c0) * Dv);

    // S = exp(L_{n-1}) S + K_w^T V.
    if (weighted)
      for (std::size_t x = 0; x < std::size_t(Dk) * Dv; ++x) S[x] *= total;
    amx::gemm<Tiles>(Dk, Dv, n32, kwt, std::size_t(C), vp, std::size_t(Dv), S, std::size_t(Dv), true);
  }
  std::copy_n(S, std::size_t(Dk) * Dv, a.hT + item.state);
}

template <class Tiles>
void forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator) {
  const Scratch at(p);
  const int threads = items_threads(p);
  Workspace<float> scratch(allocator, std::size_t(threads) * at.total);
  const long items = long(p.slices());
#pragma omp parallel num_threads(threads)
  {
    float* w = scratch.data() + std::size_t(omp_get_thread_num()) * at.total;
    amx::configure<Tiles>();  // the tile configuration is each thread's own
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < items; ++i) run_item<Tiles>(p, a, p.slice(std::size_t(i)), w, at);
    Tiles::release();
  }
}

}  // namespace

std::optional<std::string> chunked_amx_limits(const Problem& p) {
  if (p.dim % 32 != 0 || p.value_dim() % 32 != 0 || p.dim > kMaxDim || p.value_dim() > kMaxDim)
    return std::string("dim and dim_v multiples of 32 up to 256 only");
  if (p.chunk % 32 != 0 || p.chunk > kMaxChunk) return std::string("chunk a multiple of 32 up to 256 only");
  return std::nullopt;
}

std::size_t chunked_amx_forward_floats(const Problem& p) { return std::size_t(items_threads(p)) * Scratch(p).total; }

void chunked_amx_forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator, AmxPath path) {
  on_path("chunked_amx", path, [&](auto tiles) { forward<decltype(tiles)>(p, a, allocator); });
}

}  // namespace lattn::cpu
