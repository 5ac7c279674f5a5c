// The layer's bf16 products on AMX tiles (cpu/products.hpp: amx_product, amx_product_rows).
// C = op(A) op(B) with float32 operands (a bf16 case's x and dOut widened exactly, the weights and
// the intermediate activations as they are), every element rounded to bf16 (to nearest even) once
// as it is packed, and amx::gemm (kernels/cpu/amx_gemm.hpp) accumulating in float32:
//   op(B) (k x n) is packed once, whole, as VNNI pairs zero-padded to K32 = k rounded up to 32 and
//   N16 = n rounded up to 16, shared by the threads;
//   the threads take blocks of 32 rows of C dynamically: each packs its rows of op(A) to bf16 (32 x
//   K32, zero-padded), runs amx::gemm into its own 32 x N16 float32 block and hands the block's rows
//   to the caller (written into C with beta, or scattered, as the caller says).
// Every thread configures its tiles once per call and releases them at its end. The tile policy is
// the CPU's (amx::Hardware) or the emulation's (amx::Emulated), as the AMX chunked rows choose it
// (cpu/bf16.hpp: amx_path()).
#include <omp.h>

#include <algorithm>
#include <stdexcept>

#include "kernels/cpu/amx_gemm.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_amx_parts.hpp"

namespace lattn::cpu {
namespace {

using amx_chunked::pair_of;
using amx_chunked::round_up;
using amx_chunked::to_bf16;

constexpr int kBlockRows = 2 * amx::kTileRows;  // a thread's block of C: amx::gemm's 2 x 2 tiles high

// op(X)[r][c] of a row-major X (ld floats a row).
float at(const float* X, int ld, bool trans, int r, int c) {
  return trans ? X[std::size_t(c) * ld + r] : X[std::size_t(r) * ld + c];
}

int row_blocks(int m) { return (m + kBlockRows - 1) / kBlockRows; }

template <class Tiles>
void product_rows(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                  const AmxRowSink& sink, Allocator& allocator) {
  const int K32 = round_up(k, amx::kTileDepth), N16 = round_up(n, amx::kTileRows), blocks = row_blocks(m);
  Workspace<std::uint32_t> packed(allocator, std::size_t(K32 / 2) * N16);
#pragma omp parallel num_threads(threads_for(std::size_t(blocks)))
  {
#pragma omp for schedule(static)
    for (int pr = 0; pr < K32 / 2; ++pr) {
      std::uint32_t* row = packed.data() + std::size_t(pr) * N16;
      const int lo = 2 * pr, hi = lo + 1;
      for (int c = 0; c < n; ++c)
        row[c] = pair_of(lo < k ? to_bf16(at(B, ldb, trans_b, lo, c)) : Bf16(0),
                         hi < k ? to_bf16(at(B, ldb, trans_b, hi, c)) : Bf16(0));
      std::fill(row + n, row + N16, 0u);
    }
    Workspace<Bf16> a_rows(allocator, std::size_t(kBlockRows) * K32);
    Workspace<float> c_rows(allocator, std::size_t(kBlockRows) * N16);
    amx::configure<Tiles>();
#pragma omp for schedule(dynamic)
    for (int blk = 0; blk < blocks; ++blk) {
      const int r0 = blk * kBlockRows, rows = std::min(kBlockRows, m - r0), M16 = round_up(rows, amx::kTileRows);
      for (int r = 0; r < M16; ++r) {
        Bf16* row = a_rows.data() + std::size_t(r) * K32;
        if (r < rows)
          for (int c = 0; c < k; ++c) row[c] = to_bf16(at(A, lda, trans_a, r0 + r, c));
        std::fill(row + (r < rows ? k : 0), row + K32, Bf16(0));
      }
      amx::gemm<Tiles>(M16, N16, K32, a_rows.data(), std::size_t(K32), packed.data(), std::size_t(N16),
                       c_rows.data(), std::size_t(N16), false);
      sink(r0, rows, c_rows.data(), std::size_t(N16));
    }
    Tiles::release();
  }
}

// n floats rounded to bf16 (to nearest even) on the calling thread's OpenMP team.
void round_to_bf16(const float* in, Bf16* out, std::size_t n) {
#pragma omp parallel for schedule(static) num_threads(threads_for(n / 4096))
  for (std::size_t i = 0; i < n; ++i) out[i] = to_bf16(in[i]);
}

}  // namespace

std::optional<std::string> layer_amx_refusal(const LayerProblem& p) {
  if (auto why = amx_refusal()) return why;
  if (p.linear.dplr()) return std::string("the RWKV-7 block (rule dplr) has no bf16 form");
  std::string why;
  if (p.chunked && !cpu_amx_chunked_variant(p.linear, &why)) return why;
  return std::nullopt;
}

CpuBf16Variant layer_amx_linear(const LayerProblem& p) {
  std::string why;
  std::optional<CpuBf16Variant> v = cpu_amx_chunked_variant(p.linear, &why);
  if (!v) throw std::logic_error(why);
  return *v;
}

std::string layer_amx_variant_name(const LayerProblem& p) {
  return "products amx" + (p.chunked ? ", linear " + layer_amx_linear(p).name : std::string());
}

std::size_t amx_linear_forward_bytes(const CpuBf16Variant& v, const Problem& p) {
  return (2 * p.key_elems() + p.value_elems()) * sizeof(Bf16) + v.forward_workspace_bytes(p, false);
}

void amx_linear_forward(const CpuBf16Variant& v, const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  Workspace<Bf16> q(allocator, p.key_elems()), k(allocator, p.key_elems()), vv(allocator, p.value_elems());
  round_to_bf16(a.q, q.data(), q.size());
  round_to_bf16(a.k, k.data(), k.size());
  round_to_bf16(a.v, vv.data(), vv.size());
  v.forward(p, {q.data(), k.data(), vv.data(), a.h0, a.o, a.hT, a.g, a.beta}, allocator, nullptr);
}

std::size_t amx_linear_backward_bytes(const CpuBf16Variant& v, const Problem& p) {
  return (2 * p.key_elems() + 2 * p.value_elems()) * sizeof(Bf16) + v.backward_workspace_bytes(p, false);
}

void amx_linear_backward(const CpuBf16Variant& v, const Problem& p, const BackwardArgs<float>& a,
                         Allocator& allocator) {
  Workspace<Bf16> q(allocator, p.key_elems()), k(allocator, p.key_elems()), vv(allocator, p.value_elems()),
      dO(allocator, p.value_elems());
  round_to_bf16(a.q, q.data(), q.size());
  round_to_bf16(a.k, k.data(), k.size());
  round_to_bf16(a.v, vv.data(), vv.size());
  round_to_bf16(a.dO, dO.data(), dO.size());
  v.backward(p,
             {q.data(), k.data(), vv.data(), a.h0, dO.data(), a.dhT, a.dq, a.dk, a.dv, a.dh0, a.g, a.dg, a.beta,
              a.dbeta},
             allocator, nullptr);
}

std::size_t amx_product_bytes(int m, int n, int k) {
  const std::size_t K32 = std::size_t(round_up(k, amx::kTileDepth)), N16 = std::size_t(round_up(n, amx::kTileRows));
  const std::size_t threads = std::size_t(threads_for(std::size_t(row_blocks(m))));
  return K32 / 2 * N16 * sizeof(std::uint32_t) + threads * (kBlockRows * K32 * sizeof(Bf16) + kBlockRows * N16 * sizeof(float));
}

void amx_product_rows(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                      const AmxRowSink& sink, Allocator& allocator) {
  if (m <= 0 || n <= 0) return;
  amx_chunked::on_path("the layer's AMX products", amx_path(), [&](auto tiles) {
    product_rows<decltype(tiles)>(trans_a, trans_b, m, n, k, A, lda, B, ldb, sink, allocator);
  });
}

void amx_product(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc, Allocator& allocator) {
  amx_product_rows(trans_a, trans_b, m, n, k, A, lda, B, ldb,
                   [=](int r0, int rows, const float* block, std::size_t ld) {
                     for (int r = 0; r < rows; ++r) {
                       float* out = C + std::size_t(r0 + r) * ldc;
                       const float* in = block + std::size_t(r) * ld;
                       if (beta == 0.0f)
                         std::copy_n(in, n, out);
                       else
                         for (int c = 0; c < n; ++c) out[c] = in[c] + beta * out[c];
                     }
                   },
                   allocator);
}

}  // namespace lattn::cpu
