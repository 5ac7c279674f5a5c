// The additive rule's chunked forward on bf16 token tensors with AVX512-BF16 dot products
// (cpu/bf16.hpp; the `chunked_bf16` row of cpu/bf16_variants.cpp). Decays none, retnet and scalar
// gates; every shape of docs/spec.md section 1c (each (sequence, value head) item reads its own
// rows through Problem::slice).
//
// For a chunk of n rows (the last may be shorter than C) entering with the float32 state S, and
// L_i the summed log-decay of the chunk's tokens 0 .. i ((i + 1) ln gamma for retnet, the gates'
// running sum for scalar gates, 0 for none):
//   O_i    = s ( exp(L_i) (Q S)_i + sum_{j <= i} exp(L_i - L_j) (q_i . k_j) v_j )
//   S_next = exp(L_{n-1}) S + sum_j exp(L_{n-1} - L_j) k_j v_j^T
// Every product is _mm512_dpbf16_ps: 16 float32 accumulators each take the dot product of a pair
// of bf16 along the reduction dimension per step. One operand is broadcast a pair at a time (two
// adjacent bf16 of a row-major matrix, or of a pair-interleaved one); the other is packed as pairs,
// row p of the packing holding (X[2p][c], X[2p + 1][c]) for every column c. So per chunk:
//   scores = Q K^T     : Q as it is (its rows are pairs along Dk), K^T packed (K's rows' pairs, transposed)
//   O      = Q S       : S rounded to bf16 and packed (the state stays float32 between chunks)
//   O     += P V       : P = s (scores . decay mask) rounded to bf16 (rows are pairs along j), V packed
//   S     += K_w^T V   : K_w = diag(exp(L_{n-1} - L_j)) K rounded to bf16 and packed, V's packing reused
// Every rounding is to nearest even; the float32 results stay well inside the bf16 tolerance
// (tests/kernels/test_cpu_bf16.cpp). The rows past a short chunk's end are zero in every packing.
//
// The file is compiled for AVX512-BF16 whatever the build's -march (the target pragma below); its
// row takes a problem only where the CPU has it (bf16_supported), so the binary runs elsewhere.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <immintrin.h>

#include "kernels/cpu/exp.hpp"
#include "kernels/cpu/transpose16.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"

namespace lattn::cpu {
namespace {

constexpr int kRows = 8;     // rows of one product tile (broadcast operands)
constexpr int kBlocks = 2;   // 16-column blocks of one tile: 8 x 2 accumulators of 32 registers
constexpr int kWidth = kBlocks * 16;
constexpr int kMaxChunk = 256, kMaxDim = 256;

int items_threads(const Problem& p) {
  return int(std::max<std::size_t>(1, std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices())));
}

// One thread's scratch, in 4-byte words (a bf16 pair or a float32).
struct Scratch {
  std::size_t kt, vp, kw, sp, state, scores, p, q, decay, total;
  explicit Scratch(const Problem& p) {
    const std::size_t C = std::size_t(p.chunk), Dk = std::size_t(p.dim), Dv = std::size_t(p.value_dim());
    kt = 0;                        // K^T packed: [Dk / 2][C]
    vp = kt + Dk / 2 * C;          // V packed: [C / 2][Dv]
    kw = vp + C / 2 * Dv;          // K_w packed: [C / 2][Dk]
    sp = kw + C / 2 * Dk;          // S packed: [Dk / 2][Dv]
    state = sp + Dk / 2 * Dv;      // S: [Dk][Dv] float32
    scores = state + Dk * Dv;      // Q K^T: [C][C] float32
    this->p = scores + C * C;      // P: [C][C] bf16
    q = this->p + C * C / 2;       // a short chunk's Q, zero-padded: [C][Dk] bf16
    decay = q + C * Dk / 2;        // L_i, exp(L_i), exp(L_{n-1} - L_i): 3 x C float32
    total = decay + 3 * C;
  }
};

}  // namespace

std::optional<std::string> chunked_bf16_limits(const Problem& p) {
  if (p.dim % 32 != 0 || p.value_dim() % 32 != 0 || p.dim > kMaxDim || p.value_dim() > kMaxDim)
    return std::string("dim and dim_v multiples of 32 up to 256 only");
  if (p.chunk % 32 != 0 || p.chunk > kMaxChunk) return std::string("chunk a multiple of 32 up to 256 only");
  if (!bf16_supported()) return std::string("needs AVX512-BF16");
  return std::nullopt;
}

std::size_t chunked_bf16_forward_floats(const Problem& p) {
  return std::size_t(items_threads(p)) * Scratch(p).total;
}

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16"))), apply_to = function)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")
#endif

namespace {

// out[m][c] (m < rows, c < kWidth) = scale[m] * sum_p a(m, p) . b[p][c] (+ out[m][c] when
// `accumulate`; scale null: 1). a(m, p): the bf16 pair at word m * a_row + p * a_pair of `a`; b:
// packed pairs, ldb words a row. Rows past `rows` are computed (the operands are there) but not stored.
void dot_tile(int pairs, const std::uint32_t* a, std::size_t a_row, std::size_t a_pair, const std::uint32_t* b,
              std::size_t ldb, float* out, std::size_t ldo, int rows, const float* scale, bool accumulate) {
  __m512 acc[kRows][kBlocks];
  for (auto& row : acc)
    for (__m512& x : row) x = _mm512_setzero_ps();
  for (int p = 0; p < pairs; ++p) {
    __m512bh bv[kBlocks];
    const std::uint32_t* brow = b + std::size_t(p) * ldb;
    for (int c = 0; c < kBlocks; ++c) bv[c] = (__m512bh)_mm512_loadu_si512(brow + std::size_t(16) * c);
    const std::uint32_t* ap = a + std::size_t(p) * a_pair;
    for (int m = 0; m < kRows; ++m) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(int(ap[std::size_t(m) * a_row]));
      for (int c = 0; c < kBlocks; ++c) acc[m][c] = _mm512_dpbf16_ps(acc[m][c], av, bv[c]);
    }
  }
  for (int m = 0; m < rows; ++m) {
    float* o = out + std::size_t(m) * ldo;
    const __m512 sc = _mm512_set1_ps(scale ? scale[m] : 1.0f);
    for (int c = 0; c < kBlocks; ++c) {
      __m512 r = _mm512_mul_ps(acc[m][c], sc);
      if (accumulate) r = _mm512_add_ps(r, _mm512_loadu_ps(o + std::size_t(16) * c));
      _mm512_storeu_ps(o + std::size_t(16) * c, r);
    }
  }
}

// Round-to-nearest-even float32 -> bf16 of two rows of 16, interleaved as pairs: word c holds
// (lo[c], hi[c]).
inline void pack_pairs16(const float* lo, const float* hi, std::uint32_t* out) {
  const __m512i l = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(lo)));
  const __m512i h = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(hi)));
  _mm512_storeu_si512(out, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
}

// Two bf16 rows of 16 interleaved as pairs, exactly.
inline void pair_rows16(const Bf16* lo, const Bf16* hi, std::uint32_t* out) {
  const __m512i l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)));
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)));
  _mm512_storeu_si512(out, _mm512_or_si512(l, _mm512_slli_epi32(h, 16)));
}

// 16 bf16 widened to float32.
inline __m512 widen16(const Bf16* x) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x))), 16));
}

// Part `part` of `parts` of [begin, begin + bytes) prefetched into L2: the next chunk's q, k and v
// arrive while this chunk's products run, instead of stalling its first packing reads.
inline void prefetch_part(const void* begin, std::size_t bytes, int part, int parts) {
  const char* b = static_cast<const char*>(begin);
  const std::size_t lines = (bytes + 63) / 64;
  for (std::size_t l = lines * part / parts, end = lines * (part + 1) / parts; l < end; ++l)
    _mm_prefetch(b + l * 64, _MM_HINT_T1);
}

// One (sequence, value head) item: its chunks in order.
void run_item(const Problem& p, const Bf16ForwardArgs& a, const HeadSlice& item, float* w, const Scratch& at) {
  const int C = p.chunk, Dk = p.dim, Dv = p.value_dim();
  const float scale = float(attention_scale(Dk));
  const float log_gamma = p.decay == Decay::retnet ? float(std::log(decay_gamma(p.decay, item.head))) : 0.0f;
  auto* kt = reinterpret_cast<std::uint32_t*>(w + at.kt);
  auto* vp = reinterpret_cast<std::uint32_t*>(w + at.vp);
  auto* kw = reinterpret_cast<std::uint32_t*>(w + at.kw);
  auto* sp = reinterpret_cast<std::uint32_t*>(w + at.sp);
  float* S = w + at.state;
  float* scores = w + at.scores;
  auto* P = reinterpret_cast<Bf16*>(w + at.p);
  auto* qpad = reinterpret_cast<Bf16*>(w + at.q);
  float* L = w + at.decay;
  float* lam = L + C;  // s exp(L_i): the inter-chunk term's row scale
  float* gam = lam + C;
  const Bf16* q_item = a.q + item.key;
  const Bf16* k_item = a.k + item.key;
  const Bf16* v_item = a.v + item.value;
  float* o_item = a.o + item.value;
  const float* g_item = p.decay == Decay::scalar ? a.g + item.gate : nullptr;
  std::copy_n(a.h0 + item.state, std::size_t(Dk) * Dv, S);

  for (int c0 = 0; c0 < item.seq; c0 += C) {
    const int n = std::min(C, item.seq - c0);
    const int n_pad = (n + kRows - 1) / kRows * kRows;
    const Bf16* K = k_item + std::size_t(c0) * Dk;
    const Bf16* V = v_item + std::size_t(c0) * Dv;
    float* O = o_item + std::size_t(c0) * Dv;
    // Q's rows as they are, or a short chunk's copied with zero rows up to the tile's height.
    const Bf16* Q = q_item + std::size_t(c0) * Dk;
    if (n < n_pad) {
      std::fill_n(qpad, std::size_t(n_pad) * Dk, Bf16(0));
      std::copy_n(Q, std::size_t(n) * Dk, qpad);
      Q = qpad;
    }

    // Decays: L_i, lam_i = s exp(L_i), gam_j = exp(L_{n-1} - L_j).
    float run = 0;
    for (int i = 0; i < n; ++i) {
      run += g_item ? g_item[c0 + i] : log_gamma;
      L[i] = run;
    }
    for (int i = 0; i < n; ++i) {
      lam[i] = scale * exp_nonpositive(L[i]);
      gam[i] = exp_nonpositive(L[n - 1] - L[i]);
    }
    const float total = n > 0 ? exp_nonpositive(L[n - 1]) : 1.0f;

    // K^T packed: kt[p][j] = K[j]'s pair p (zero for j >= n), through 16 x 16 word transposes.
    const auto* k_words = reinterpret_cast<const float*>(K);
    for (int j0 = 0; j0 < C; j0 += 16)
      for (int p0 = 0; p0 < Dk / 2; p0 += 16) {
        __m512 r[16];
        for (int i = 0; i < 16; ++i)
          r[i] = j0 + i < n ? _mm512_loadu_ps(k_words + std::size_t(j0 + i) * (Dk / 2) + p0) : _mm512_setzero_ps();
        transpose16(r);
        for (int i = 0; i < 16; ++i) _mm512_storeu_ps(reinterpret_cast<float*>(kt + std::size_t(p0 + i) * C + j0), r[i]);
      }
    // V packed (exact) and K_w packed (rounded unless every weight is 1); zero past n.
    const bool weighted = p.decay != Decay::none;
    const int n_next = std::min(C, std::max(0, item.seq - c0 - C));  // the next chunk's rows
    for (int pr = 0; pr < C / 2; ++pr) {
      const int j = 2 * pr;
      std::uint32_t* vrow = vp + std::size_t(pr) * Dv;
      std::uint32_t* krow = kw + std::size_t(pr) * Dk;
      if (j >= n) {
        std::fill_n(vrow, Dv, 0u);
        std::fill_n(krow, Dk, 0u);
        continue;
      }
      static const Bf16 zeros[kMaxDim] = {};
      const Bf16* v_hi = j + 1 < n ? V + std::size_t(j + 1) * Dv : zeros;
      const Bf16* k_hi = j + 1 < n ? K + std::size_t(j + 1) * Dk : zeros;
      for (int e = 0; e < Dv; e += 16) pair_rows16(V + std::size_t(j) * Dv + e, v_hi + e, vrow + e);
      if (!weighted) {
        for (int d = 0; d < Dk; d += 16) pair_rows16(K + std::size_t(j) * Dk + d, k_hi + d, krow + d);
        continue;
      }
      const __m512 w_lo = _mm512_set1_ps(gam[j]), w_hi = _mm512_set1_ps(j + 1 < n ? gam[j + 1] : 0.0f);
      for (int d = 0; d < Dk; d += 16) {
        alignas(64) float lo[16], hi[16];
        _mm512_store_ps(lo, _mm512_mul_ps(widen16(K + std::size_t(j) * Dk + d), w_lo));
        _mm512_store_ps(hi, _mm512_mul_ps(widen16(k_hi + d), w_hi));
        pack_pairs16(lo, hi, krow + d);
      }
    }
    // S packed for this chunk's Q S (rounded); S itself stays float32.
    for (int pr = 0; pr < Dk / 2; ++pr)
      for (int e = 0; e < Dv; e += 16)
        pack_pairs16(S + std::size_t(2 * pr) * Dv + e, S + std::size_t(2 * pr + 1) * Dv + e, sp + std::size_t(pr) * Dv + e);

    // scores = Q K^T on the blocks at or below the diagonal, then P = s (scores . decay mask).
    const auto* q_words = reinterpret_cast<const std::uint32_t*>(Q);
    const int row_tiles = (n + kRows - 1) / kRows;
    for (int m0 = 0; m0 < n; m0 += kRows) {
      prefetch_part(Q + std::size_t(C) * Dk, std::size_t(n_next) * Dk * sizeof(Bf16), m0 / kRows, row_tiles);
      prefetch_part(K + std::size_t(C) * Dk, std::size_t(n_next) * Dk * sizeof(Bf16), m0 / kRows, row_tiles);
      for (int j0 = 0; j0 < m0 + kRows; j0 += kWidth)
        dot_tile(Dk / 2, q_words + std::size_t(m0) * (Dk / 2), Dk / 2, 1, kt + j0, C, scores + std::size_t(m0) * C + j0,
                 C, kRows, nullptr, false);
    }
    for (int i = 0; i < n_pad; ++i) {
      Bf16* prow = P + std::size_t(i) * C;
      const int last = i < n ? i : -1;  // rows past n (a short chunk's padding) are zero
      const float* srow = scores + std::size_t(i) * C;
      alignas(64) float row[kMaxChunk];
      if (weighted)
        for (int j = 0; j <= last; ++j) row[j] = scale * srow[j] * exp_nonpositive(L[i] - L[j]);
      else
        for (int j = 0; j <= last; ++j) row[j] = scale * srow[j];
      std::fill(row + std::max(last + 1, 0), row + C, 0.0f);
      for (int j = 0; j < C; j += 16)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(prow + j), (__m256i)_mm512_cvtneps_pbh(_mm512_load_ps(row + j)));
    }

    // O = diag(lam) Q S, then O += P V over the columns up to each row tile's diagonal.
    const auto* p_words = reinterpret_cast<const std::uint32_t*>(P);
    for (int m0 = 0; m0 < n; m0 += kRows) {
      const int rows = std::min(kRows, n - m0);
      const int pairs = (m0 + kRows) / 2;
      prefetch_part(V + std::size_t(C) * Dv, std::size_t(n_next) * Dv * sizeof(Bf16), m0 / kRows, row_tiles);
      for (int e0 = 0; e0 < Dv; e0 += kWidth) {
        float* out = O + std::size_t(m0) * Dv + e0;
        dot_tile(Dk / 2, q_words + std::size_t(m0) * (Dk / 2), Dk / 2, 1, sp + e0, Dv, out, Dv, rows, lam + m0, false);
        dot_tile(pairs, p_words + std::size_t(m0) * (C / 2), C / 2, 1, vp + e0, Dv, out, Dv, rows, nullptr, true);
      }
    }

    // S = exp(L_{n-1}) S + K_w^T V.
    if (weighted) {
      const __m512 t = _mm512_set1_ps(total);
      for (std::size_t x = 0; x < std::size_t(Dk) * Dv; x += 16) _mm512_storeu_ps(S + x, _mm512_mul_ps(t, _mm512_loadu_ps(S + x)));
    }
    const int pairs = (n + 1) / 2;
    for (int d0 = 0; d0 < Dk; d0 += kRows)
      for (int e0 = 0; e0 < Dv; e0 += kWidth)
        dot_tile(pairs, kw + d0, 1, Dk, vp + e0, Dv, S + std::size_t(d0) * Dv + e0, Dv, kRows, nullptr, true);
  }
  std::copy_n(S, std::size_t(Dk) * Dv, a.hT + item.state);
}

}  // namespace

void chunked_bf16_forward(const Problem& p, const Bf16ForwardArgs& a, Allocator& allocator) {
  const Scratch at(p);
  const int threads = items_threads(p);
  Workspace<float> scratch(allocator, std::size_t(threads) * at.total);
  const long items = long(p.slices());
#pragma omp parallel num_threads(threads)
  {
    float* w = scratch.data() + std::size_t(omp_get_thread_num()) * at.total;
#pragma omp for schedule(dynamic, 1)
    for (long i = 0; i < items; ++i) run_item(p, a, p.slice(std::size_t(i)), w, at);
  }
}

#if defined(__clang__)
#pragma clang attribute pop
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif

}  // namespace lattn::cpu
