// The hybrid linear + sliding-window attention block on the CPU, float32 (docs/spec.md section 2):
//   Q, K, V = x Wq, x Wk, x Wv                         (B*T x M sgemms, scattered to [B][H][T][Dh])
//   Lin     = causal linear attention (cpu::scan_* or cpu::chunked_*, h0 = 0)
//   Swa     = sliding-window softmax attention (kernels/sliding_window/cpu.cpp)
//   Y_h     = sig(beta_h) RMSNorm(Lin_h) g_h + (1 - sig(beta_h)) Swa_h      (written to [B][T][M])
//   out     = Y Wo
// Backward of <out, dOut>, with r = (mean(Lin^2) + eps)^-1/2 per row and u = g . sig . dY_h:
//   dWo = Y^T dOut, dY = dOut Wo^T
//   dbeta_h = sig (1 - sig) sum dY_h . (Linn_h - Swa_h),   dg = sum sig dY_h . Lin r
//   dLin = r u - (r^3 / Dh) (u . Lin) Lin,                  dSwa = (1 - sig) dY_h
//   dq, dk, dv = linear backward (dO = dLin, dhT = 0) + sliding-window backward (dO = dSwa)
//   dx = dQ Wq^T + dK Wk^T + dV Wv^T,   dW* = x^T d*       (d* gathered back to [B][T][M])
//
// The four projections carry most of the flops (84% of the default suite's). They run through
// cpu/products.hpp: the packed products of kernels/cpu/packed_gemm.hpp (each weight packed once and
// shared by the threads, which take blocks of rows in turn), or OpenBLAS's sgemm single-threaded on
// blocks of rows (product_path() says which). The input projections' outputs are scattered to the
// per-head layout from an L2-sized tile, so the layout change costs one write.
// A bf16 case (layer_*_bf16) runs the same steps with every product on AMX tiles and the chunked
// branch on its AMX row (cpu/products.hpp: amx_product, amx_linear_forward/backward).
// Scratch is O(B * T * M) and grows linearly in T; fwd_bwd keeps what the backward reads
// (Q, K, V, Lin, Swa, Y, per-row lse and r, and the chunked branch's chunk states) instead of
// recomputing the forward.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/sliding_window/cpu.hpp"

namespace lattn::cpu {
namespace {

// How a call runs: float32 (the products through product_path()), or a bf16 case on AMX tiles
// (products.hpp: every product amx_product, a chunked branch on `linear`, an AMX row).
struct Path {
  bool amx = false;
  const CpuBf16Variant* linear = nullptr;  // amx and chunked only
};

constexpr int kRowTile = 256;  // 256 x 3M floats of projection output per thread: 1.5 MiB at M = 512

// Rows of the projection tiles: OpenBLAS's 256, or the packed products' row blocks (gemm::row_blocks:
// at most 140 rows at AVX-512, whole micro-tiles, as many per thread): a tile is then one packing of
// its rows and one pass over the packed weights, and its output and packed rows (140 x (3M + 256)
// floats) take less scratch than OpenBLAS's tile.
gemm::RowBlocks packed_tiles(const LayerProblem& p) { return gemm::row_blocks(int(p.rows()), omp_get_max_threads()); }
std::size_t tile_rows(const LayerProblem& p) {
  if (product_path() == ProductPath::packed) return std::size_t(packed_tiles(p).most_rows);
  return std::min<std::size_t>(kRowTile, p.rows());
}
std::size_t row_tiles(const LayerProblem& p) {
  if (product_path() == ProductPath::packed) return std::size_t(packed_tiles(p).count);
  return (p.rows() + kRowTile - 1) / kRowTile;
}

// Whether the packed path writes the input projections straight into the per-head layouts: every
// packed panel's columns lie in one head of one of Q, K, V.
bool projects_directly(const LayerProblem& p) {
  const int nr = gemm::panel_width();
  return product_path() == ProductPath::packed && int(p.model_dim()) % nr == 0 && p.linear.dim % nr == 0;
}

// The input projections' scratch: [Wq Wk Wv] side by side (M x 3M: copied for OpenBLAS, packed
// for the packed products), and per thread a row tile of all three outputs (and the packed path's
// packing of the tile's rows); written directly, a thread's panel destinations instead of the tile.
std::size_t projection_bytes(const LayerProblem& p, const Path& path) {
  if (path.amx) return amx_product_bytes(int(p.rows()), int(p.model_dim()), int(p.model_dim()));
  const std::size_t M = p.model_dim(), rows = tile_rows(p);
  const std::size_t threads = std::size_t(threads_for(row_tiles(p)));
  if (projects_directly(p))
    return 3 * gemm::packed_b_floats(int(M), int(M)) * sizeof(float) +
           threads * (gemm::packed_a_floats(int(rows), int(M)) * sizeof(float) +
                      3 * M / std::size_t(gemm::panel_width()) * sizeof(float*));
  if (product_path() == ProductPath::packed)
    return (3 * gemm::packed_b_floats(int(M), int(M)) +
            threads * (rows * 3 * M + gemm::packed_a_floats(int(rows), int(M)))) *
           sizeof(float);
  return (3 * M * M + threads * rows * 3 * M) * sizeof(float);
}

// Rows [r0, r0 + n) of the tile (n x 3M, [Q K V] side by side) to the per-head layouts.
void scatter_tile(const LayerProblem& p, const float* tile, std::size_t r0, std::size_t n, float* const out[3]) {
  const int M = int(p.model_dim()), T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  for (std::size_t i = 0; i < n; ++i) {
    const std::size_t b = (r0 + i) / T, t = (r0 + i) % T;
    for (int which = 0; which < 3; ++which)
      for (int h = 0; h < H; ++h)
        std::copy_n(tile + (i * 3 + which) * M + std::size_t(h) * Dh, Dh, out[which] + ((b * H + h) * T + t) * Dh);
  }
}

// The packed path: the weights packed once (the threads share the panels out), then each row tile
// multiplied on its thread. Where M is a multiple of the panel width the three packings side by side
// are [Wq Wk Wv]'s, and one product per tile reads the tile's rows once; where the head dim is one too,
// every panel's columns lie in one head, and the product writes them straight into the per-head
// layouts (a tile's rows cut where a sequence ends), with no tile to scatter from.
void project_to_heads_packed(const LayerProblem& p, const float* x, const float* const w[3], float* const out[3],
                             Allocator& allocator) {
  const int M = int(p.model_dim()), T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  const gemm::RowBlocks blocks = packed_tiles(p);
  const long tiles = blocks.count;
  const std::size_t rows = std::size_t(blocks.most_rows);
  const std::size_t per_weight = gemm::packed_b_floats(M, M);
  const int nr = gemm::panel_width();
  const bool joined = M % nr == 0, direct = projects_directly(p);
  Workspace<float> packed(allocator, 3 * per_weight);
#pragma omp parallel num_threads(threads_for(std::size_t(tiles)))
  {
    for (int which = 0; which < 3; ++which)
      gemm::pack_b(false, M, M, w[which], M, packed.data() + which * per_weight);
    Workspace<float> tile(allocator, direct ? 0 : rows * 3 * M);
    Workspace<float> rows_packed(allocator, gemm::packed_a_floats(int(rows), M));
    Workspace<float*> panel_c(allocator, direct ? std::size_t(3 * M / nr) : 0);
#pragma omp for schedule(dynamic)  // as in parallel_sgemm
    for (long index = 0; index < tiles; ++index) {
      const std::size_t r0 = std::size_t(blocks.begin(int(index))), n = std::size_t(blocks.begin(int(index) + 1)) - r0;
      if (direct) {
        for (std::size_t s0 = r0; s0 < r0 + n;) {
          const std::size_t b = s0 / T, t0 = s0 % T, s1 = std::min(r0 + n, (b + 1) * T);
          for (std::size_t panel = 0; panel < panel_c.size(); ++panel) {
            const std::size_t col = panel * nr, which = col / M, h = col % M / Dh, d0 = col % Dh;
            panel_c[panel] = out[which] + ((b * H + h) * T + t0) * Dh + d0;
          }
          gemm::multiply_packed_to_panels(false, int(s1 - s0), 3 * M, M, x + s0 * M, M, packed.data(), 0.0f,
                                          panel_c.data(), Dh, rows_packed.data());
          s0 = s1;
        }
      } else if (joined) {
        gemm::multiply_packed(false, int(n), 3 * M, M, x + r0 * M, M, packed.data(), 0.0f, tile.data(), 3 * M,
                              rows_packed.data());
        scatter_tile(p, tile.data(), r0, n, out);
      } else {
        for (int which = 0; which < 3; ++which)
          gemm::multiply_packed(false, int(n), M, M, x + r0 * M, M, packed.data() + which * per_weight, 0.0f,
                                tile.data() + std::ptrdiff_t(which) * M, 3 * M, rows_packed.data());
        scatter_tile(p, tile.data(), r0, n, out);
      }
    }
  }
}

// dst[b][h][t][:] = (x W)[b*T + t][h*Dh : (h+1)*Dh] for W = wq, wk, wv into q, k, v.
// One product per row tile against [Wq Wk Wv]: OpenBLAS packs the tile of x once instead of three
// times (2 threads, 4096 x 512 rows: ~11% faster than three products of 512 columns).
// On AMX tiles: one product per weight, each block of rows scattered to its heads.
void project_to_heads_amx(const LayerProblem& p, const float* x, const float* const w[3], float* const out[3],
                          Allocator& allocator) {
  const int M = int(p.model_dim()), T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  for (int which = 0; which < 3; ++which)
    amx_product_rows(false, false, int(p.rows()), M, M, x, M, w[which], M,
                     [&](int r0, int rows, const float* block, std::size_t ld) {
                       for (int i = 0; i < rows; ++i) {
                         const std::size_t b = std::size_t(r0 + i) / T, t = std::size_t(r0 + i) % T;
                         for (int h = 0; h < H; ++h)
                           std::copy_n(block + i * ld + std::size_t(h) * Dh, Dh,
                                       out[which] + ((b * H + h) * T + t) * Dh);
                       }
                     },
                     allocator);
}

void project_to_heads(const LayerProblem& p, const Path& path, const float* x, const float* const w[3],
                      float* const out[3], Allocator& allocator) {
  if (path.amx) return project_to_heads_amx(p, x, w, out, allocator);
  if (product_path() == ProductPath::packed) return project_to_heads_packed(p, x, w, out, allocator);
  const int M = int(p.model_dim());
  const long tiles = long(row_tiles(p));
  Workspace<float> wqkv(allocator, 3 * std::size_t(M) * M);
  for (int i = 0; i < M; ++i)
    for (int which = 0; which < 3; ++which)
      std::copy_n(w[which] + std::size_t(i) * M, M, wqkv.data() + (std::size_t(i) * 3 + which) * M);
#pragma omp parallel num_threads(threads_for(std::size_t(tiles)))
  {
    Workspace<float> tile(allocator, std::min<std::size_t>(kRowTile, p.rows()) * 3 * M);
#pragma omp for schedule(dynamic)  // as in parallel_sgemm
    for (long index = 0; index < tiles; ++index) {
      const std::size_t r0 = std::size_t(index) * kRowTile, n = std::min<std::size_t>(kRowTile, p.rows() - r0);
      sgemm(false, false, int(n), 3 * M, M, x + r0 * M, M, wqkv.data(), 3 * M, 0.0f, tile.data(), 3 * M);
      scatter_tile(p, tile.data(), r0, n, out);
    }
  }
}

// dst[(b*T + t) * ldd + h*Dh + j] = src[b][h][t][j]
void heads_to_rows(const LayerProblem& p, const float* src, float* dst, std::size_t ldd) {
  const int T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  const long rows = long(p.rows());
#pragma omp parallel for schedule(static) num_threads(threads_for(p.rows() / 64))
  for (long r = 0; r < rows; ++r) {
    const std::size_t b = std::size_t(r) / T, t = std::size_t(r) % T;
    for (int h = 0; h < H; ++h)
      std::copy_n(src + ((b * H + h) * T + t) * Dh, Dh, dst + std::size_t(r) * ldd + std::size_t(h) * Dh);
  }
}

// C = A op(B) + beta C, and C = A^T B to `outs` in groups of `out_cols`, on the call's path; their scratch.
std::size_t product_bytes(const Path& path, int m, int n, int k) {
  return path.amx ? amx_product_bytes(m, n, k) : layer_product_bytes(m, n, k);
}
void product(const Path& path, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
             float beta, float* C, int ldc, Allocator& allocator) {
  if (path.amx) return amx_product(false, trans_b, m, n, k, A, lda, B, ldb, beta, C, ldc, allocator);
  layer_product(trans_b, m, n, k, A, lda, B, ldb, beta, C, ldc, allocator);
}
std::size_t weight_product_bytes(const Path& path, int m, int n, int k, int out_cols) {
  return path.amx ? amx_product_bytes(m, n, k) : layer_weight_product_bytes(m, n, k, out_cols);
}
void weight_product(const Path& path, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                    float* const* outs, int out_cols, Allocator& allocator) {
  if (!path.amx) return layer_weight_product(m, n, k, A, lda, B, ldb, outs, out_cols, allocator);
  amx_product_rows(true, false, m, n, k, A, lda, B, ldb,
                   [&](int r0, int rows, const float* block, std::size_t ld) {
                     for (int r = 0; r < rows; ++r)
                       for (int j0 = 0; j0 < n; j0 += out_cols)
                         std::copy_n(block + r * ld + j0, std::min(out_cols, n - j0),
                                     outs[j0 / out_cols] + std::size_t(r0 + r) * out_cols);
                   },
                   allocator);
}

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Y = sig RMSNorm(Lin) g + (1 - sig) Swa, into [B][T][M]; keeps each row's r when `rinv` is given.
void norm_and_gate(const LayerProblem& p, const float* g, const float* beta, const float* lin, const float* swa,
                   float* y, float* rinv) {
  const int T = p.linear.seq, H = p.linear.heads, Dh = p.linear.dim;
  const std::size_t M = p.model_dim();
  const long heads_total = long(p.linear.heads_total());
#pragma omp parallel for schedule(static) num_threads(threads_for(p.linear.heads_total()))
  for (long bh = 0; bh < heads_total; ++bh) {
    const int b = int(bh / H), h = int(bh % H);
    const float sig = sigmoid(beta[h]);
    const float* gh = g + std::size_t(h) * Dh;
    for (int t = 0; t < T; ++t) {
      const std::size_t row = std::size_t(bh) * T + t;
      const float* __restrict l = lin + row * Dh;
      const float* __restrict sw = swa + row * Dh;
      float* __restrict out = y + (std::size_t(b) * T + t) * M + std::size_t(h) * Dh;
      float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
      for (int j = 0; j < Dh; ++j) squares += l[j] * l[j];
      const float r = 1.0f / std::sqrt(squares / float(Dh) + float(kRmsNormEps));
      if (rinv) rinv[row] = r;
      const float a = sig * r, c = 1.0f - sig;
#pragma omp simd
      for (int j = 0; j < Dh; ++j) out[j] = a * gh[j] * l[j] + c * sw[j];
    }
  }
}

// Everything the forward leaves for the backward, and the forward itself.
struct ForwardBuffers {
  float *q, *k, *v, *lin, *swa, *y;
  float *h0, *hT;     // h0 is all zeros
  float *lse, *rinv;  // null in a forward-only call
  float* chunk_states;  // the chunked branch's states for its backward, or null
};

void forward_pass(const LayerProblem& p, const Path& path, const LayerForwardArgs<float>& a,
                  const ForwardBuffers& f, Allocator& allocator) {
  const float* const w[3] = {a.wq, a.wk, a.wv};
  float* const qkv[3] = {f.q, f.k, f.v};
  project_to_heads(p, path, a.x, w, qkv, allocator);

  std::fill_n(f.h0, p.linear.state_elems(), 0.0f);
  const ForwardArgs<float> linear{f.q, f.k, f.v, f.h0, f.lin, f.hT};
  if (path.linear)
    amx_linear_forward(*path.linear, p.linear, linear, allocator);
  else if (p.chunked)
    chunked_forward(p.linear, linear, allocator, f.chunk_states);
  else
    scan_forward(p.linear, linear, allocator);
  sliding_window_forward(p.linear, p.window, {f.q, f.k, f.v, f.swa, f.lse}, allocator);

  norm_and_gate(p, a.g, a.beta, f.lin, f.swa, f.y, f.rinv);
  const int M = int(p.model_dim());
  product(path, false, int(p.rows()), M, M, f.y, M, a.wo, M, 0.0f, a.out, M, allocator);
}

std::size_t max_of(std::initializer_list<std::size_t> values) { return std::max(values); }

std::size_t kept_chunk_states_bytes(const LayerProblem& p, const Path& path) {
  return p.chunked && p.keep_chunk_states && !path.amx ? chunked_kept_states_bytes(p.linear) : 0;
}

std::size_t forward_bytes(const LayerProblem& p, const Path& path) {
  const Problem& lp = p.linear;
  const std::size_t kept = (5 * p.token_elems() + 2 * lp.state_elems()) * sizeof(float);
  const std::size_t linear = path.linear ? amx_linear_forward_bytes(*path.linear, lp)
                             : p.chunked ? chunked_forward_workspace_bytes(lp)
                                         : scan_forward_workspace_bytes(lp);
  const int M = int(p.model_dim());
  return kept + max_of({projection_bytes(p, path), linear, sliding_window_forward_workspace_bytes(lp, p.window),
                        product_bytes(path, int(p.rows()), M, M)});
}

std::size_t forward_backward_bytes(const LayerProblem& p, const Path& path) {
  const Problem& lp = p.linear;
  const std::size_t rows_per_head = lp.heads_total() * lp.seq;
  const std::size_t kept_states = kept_chunk_states_bytes(p, path);
  const std::size_t kept = (12 * p.token_elems() + 3 * lp.state_elems() + 2 * rows_per_head) * sizeof(float) +
                           lp.heads_total() * (1 + lp.dim) * sizeof(double) + kept_states;
  const std::size_t linear =
      path.linear ? max_of({amx_linear_forward_bytes(*path.linear, lp), amx_linear_backward_bytes(*path.linear, lp)})
      : p.chunked ? max_of({chunked_forward_workspace_bytes(lp, kept_states > 0), chunked_backward_workspace_bytes(lp, kept_states > 0)})
                  : max_of({scan_forward_workspace_bytes(lp), scan_backward_workspace_bytes(lp)});
  const int M = int(p.model_dim()), rows = int(p.rows());
  return kept + max_of({projection_bytes(p, path), linear, sliding_window_forward_workspace_bytes(lp, p.window),
                        weight_product_bytes(path, M, 3 * M, rows, M), weight_product_bytes(path, M, M, rows, M),
                        product_bytes(path, rows, M, M),
                        sliding_window_backward_workspace_bytes(lp, p.window)});
}

void forward(const LayerProblem& p, const Path& path, const LayerForwardArgs<float>& a, Allocator& allocator) {
  const std::size_t N = p.token_elems(), S = p.linear.state_elems();
  Workspace<float> q(allocator, N), k(allocator, N), v(allocator, N), lin(allocator, N), swa(allocator, N);
  Workspace<float> h0(allocator, S), hT(allocator, S);
  // Q is dead once both branches have run, so Y takes its place.
  forward_pass(p, path, a,
               {q.data(), k.data(), v.data(), lin.data(), swa.data(), q.data(), h0.data(), hT.data(), nullptr, nullptr,
                nullptr},
               allocator);
}

void forward_backward(const LayerProblem& p, const Path& path, const LayerBackwardArgs<float>& a,
                      Allocator& allocator) {
  const Problem& lp = p.linear;
  const std::size_t N = p.token_elems(), S = lp.state_elems(), R = lp.heads_total() * lp.seq;
  const int M = int(p.model_dim()), T = lp.seq, H = lp.heads, Dh = lp.dim, rows = int(p.rows());
  Workspace<float> q(allocator, N), k(allocator, N), v(allocator, N), swa(allocator, N);
  // Y, dY and Lin side by side: once the backward no longer reads them they hold [dQ dK dV] as one
  // rows x 3M matrix for the weight gradients' single product.
  Workspace<float> y_dy_lin(allocator, 3 * N);
  float *const y = y_dy_lin.data(), *const dy = y + N, *const lin = dy + N;
  Workspace<float> dlin(allocator, N), dswa(allocator, N), dq(allocator, N), dk(allocator, N), dv(allocator, N);
  Workspace<float> h0(allocator, S), hT(allocator, S), dh0(allocator, S), lse(allocator, R), rinv(allocator, R);
  Workspace<double> dbeta_part(allocator, lp.heads_total()), dg_part(allocator, lp.heads_total() * Dh);
  Workspace<float> chunk_states(allocator, kept_chunk_states_bytes(p, path) / sizeof(float));

  forward_pass(p, path, {a.x, a.wq, a.wk, a.wv, a.wo, a.g, a.beta, a.out},
               {q.data(), k.data(), v.data(), lin, swa.data(), y, h0.data(), hT.data(), lse.data(), rinv.data(),
                chunk_states.data()},
               allocator);

  // Output projection.
  float* const dwo[1] = {a.dwo};
  weight_product(path, M, M, rows, y, M, a.dOut, M, dwo, M, allocator);
  product(path, true, rows, M, M, a.dOut, M, a.wo, M, 0.0f, dy, M, allocator);

  // Gate and norm, per head; beta's and g's sums are kept per (batch, head) in double and added up
  // after, so that no thread waits on another and long sums do not lose the small terms.
  const long heads_total = long(lp.heads_total());
#pragma omp parallel for schedule(static) num_threads(threads_for(lp.heads_total()))
  for (long bh = 0; bh < heads_total; ++bh) {
    const int b = int(bh / H), h = int(bh % H);
    const float sig = sigmoid(a.beta[h]);
    const float* gh = a.g + std::size_t(h) * Dh;
    double dbeta = 0;
    double* dg = dg_part.data() + std::size_t(bh) * Dh;
    std::fill_n(dg, Dh, 0.0);
    for (int t = 0; t < T; ++t) {
      const std::size_t row = std::size_t(bh) * T + t;
      const float* __restrict l = lin + row * Dh;
      const float* __restrict sw = swa.data() + row * Dh;
      const float* __restrict d = dy + (std::size_t(b) * T + t) * M + std::size_t(h) * Dh;
      float* __restrict dl = dlin.data() + row * Dh;
      float* __restrict ds = dswa.data() + row * Dh;
      const float r = rinv[row];
      float gate = 0.0f, ul = 0.0f;
#pragma omp simd reduction(+ : gate, ul)
      for (int j = 0; j < Dh; ++j) {
        gate += d[j] * (r * gh[j] * l[j] - sw[j]);
        ul += gh[j] * d[j] * l[j];
      }
      dbeta += gate;
      ul *= sig;
      const float c = r * r * r / float(Dh) * ul;
      const float sr = sig * r;
#pragma omp simd
      for (int j = 0; j < Dh; ++j) {
        dl[j] = sr * gh[j] * d[j] - c * l[j];
        ds[j] = (1.0f - sig) * d[j];
      }
#pragma omp simd
      for (int j = 0; j < Dh; ++j) dg[j] += double(sr * d[j] * l[j]);
    }
    dbeta_part[std::size_t(bh)] = dbeta;
  }
  for (int h = 0; h < H; ++h) {
    const double sig = 1.0 / (1.0 + std::exp(-double(a.beta[h])));
    double dbeta = 0;
    for (int b = 0; b < lp.batch; ++b) dbeta += dbeta_part[std::size_t(b) * H + h];
    a.dbeta[h] = float(dbeta * sig * (1.0 - sig));
    for (int j = 0; j < Dh; ++j) {
      double dg = 0;
      for (int b = 0; b < lp.batch; ++b) dg += dg_part[(std::size_t(b) * H + h) * Dh + j];
      a.dg[std::size_t(h) * Dh + j] = float(dg);
    }
  }

  // Both branches' gradients of q, k, v, the window's added onto the linear branch's.
  // h0 = 0 serves as dhT = 0 too: nothing reads the final state.
  const BackwardArgs<float> linear{q.data(),  k.data(),  v.data(),  h0.data(), dlin.data(),
                                   h0.data(), dq.data(), dk.data(), dv.data(), dh0.data()};
  if (path.linear)
    amx_linear_backward(*path.linear, lp, linear, allocator);
  else if (p.chunked)
    chunked_backward(lp, linear, allocator, chunk_states.data());
  else
    scan_backward(lp, linear, allocator);
  SlidingWindowBackwardArgs window{q.data(), k.data(), v.data(), swa.data(), lse.data(), dswa.data(),
                                   dq.data(), dk.data(), dv.data(), true};
  sliding_window_backward(lp, p.window, window, allocator);

  // Back to rows, as G = [dQ dK dV] (B*T x 3M) in the buffers the backward no longer reads (Y, dY,
  // Lin), then the input projections' gradients: dx = sum_i G_i W_i^T, [dWq dWk dWv] = x^T G.
  float* const g3 = y_dy_lin.data();
  heads_to_rows(p, dq.data(), g3, 3 * std::size_t(M));
  heads_to_rows(p, dk.data(), g3 + M, 3 * std::size_t(M));
  heads_to_rows(p, dv.data(), g3 + 2 * std::ptrdiff_t(M), 3 * std::size_t(M));
  const float* const w[3] = {a.wq, a.wk, a.wv};
  for (int i = 0; i < 3; ++i)
    product(path, true, rows, M, M, g3 + std::ptrdiff_t(i) * M, 3 * M, w[i], M, i == 0 ? 0.0f : 1.0f, a.dx, M,
            allocator);
  float* const dw[3] = {a.dwq, a.dwk, a.dwv};
  weight_product(path, M, 3 * M, rows, a.x, M, g3, 3 * M, dw, M, allocator);
}

// A bf16 case's path: its chunked branch's AMX row (held for the call).
struct AmxCall {
  std::optional<CpuBf16Variant> row;
  Path path;
  explicit AmxCall(const LayerProblem& p) : row(p.chunked ? std::optional(layer_amx_linear(p)) : std::nullopt) {
    path.amx = true;
    path.linear = row ? &*row : nullptr;
  }
};

}  // namespace

std::size_t layer_forward_workspace_bytes(const LayerProblem& p) { return forward_bytes(p, {}); }
std::size_t layer_forward_backward_workspace_bytes(const LayerProblem& p) { return forward_backward_bytes(p, {}); }
std::size_t layer_kept_chunk_states_bytes(const LayerProblem& p) { return kept_chunk_states_bytes(p, {}); }

void layer_forward(const LayerProblem& p, const LayerForwardArgs<float>& a, Allocator& allocator) {
  forward(p, {}, a, allocator);
}

void layer_forward_backward(const LayerProblem& p, const LayerBackwardArgs<float>& a, Allocator& allocator) {
  forward_backward(p, {}, a, allocator);
}

// x (and dOut) widened once, exactly, for the float32 code around the products.
std::size_t layer_forward_bf16_workspace_bytes(const LayerProblem& p) {
  return p.token_elems() * sizeof(float) + forward_bytes(p, AmxCall(p).path);
}

std::size_t layer_forward_backward_bf16_workspace_bytes(const LayerProblem& p) {
  return 2 * p.token_elems() * sizeof(float) + forward_backward_bytes(p, AmxCall(p).path);
}

void layer_forward_bf16(const LayerProblem& p, const LayerForwardArgs<float>& a, const LayerBf16Tokens& tokens,
                        Allocator& allocator) {
  const AmxCall call(p);
  Workspace<float> x(allocator, p.token_elems());
  widen_bf16(tokens.x, x.data(), x.size());
  LayerForwardArgs<float> args = a;
  args.x = x.data();
  forward(p, call.path, args, allocator);
}

void layer_forward_backward_bf16(const LayerProblem& p, const LayerBackwardArgs<float>& a,
                                 const LayerBf16Tokens& tokens, Allocator& allocator) {
  const AmxCall call(p);
  Workspace<float> x(allocator, p.token_elems()), dOut(allocator, p.token_elems());
  widen_bf16(tokens.x, x.data(), x.size());
  widen_bf16(tokens.dOut, dOut.data(), dOut.size());
  LayerBackwardArgs<float> args = a;
  args.x = x.data();
  args.dOut = dOut.data();
  forward_backward(p, call.path, args, allocator);
}

}  // namespace lattn::cpu
