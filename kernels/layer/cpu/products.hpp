// The layer's products on the CPU. Every OpenBLAS product the projections make calls `sgemm` below,
// the one place that names the BLAS routine; parallel_sgemm and k_split_product take OpenMP threads
// over blocks that whichever thread is free takes, with the product single-threaded inside
// (project_to_heads in hybrid/cpu.cpp calls sgemm on its own row tiles).
// The hybrid layer (hybrid/cpu.cpp) and the modern block (block/cpu.cpp) take their products through
// layer_product / layer_weight_product, which run either those or the packed products of
// kernels/cpu/packed_gemm.hpp: product_path() says which.
// A bf16 case (where the CPU has AMX-BF16) runs every product of either block through amx_product
// below instead (cpu/amx_products.cpp).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "core/workspace.hpp"
#include "kernels/layer/problem.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"

namespace lattn::cpu {

// C = op(A) op(B) + beta C, row-major, on the calling thread: cblas_sgemm.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
           float beta, float* C, int ldc);

// Threads for `tasks` independent pieces of work: at most omp_get_max_threads(), at least 1.
int threads_for(std::size_t tasks);

// C = A op(B) + beta C (m x n, row-major), in blocks of C's rows. No scratch.
void parallel_sgemm(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                    float beta, float* C, int ldc);

// C = A^T B (m x n) of A (k x m) and B (k x n), k the batch's tokens, split over k (scratch:
// k_split_bytes). C's columns go to `outs` in groups of `out_cols` (row stride out_cols).
std::size_t k_split_bytes(int m, int n, int k);
void k_split_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                     int out_cols, Allocator& allocator);

// Which products the hybrid layer runs: OpenBLAS's sgemm, or the packed products. By default what
// the tuning's layer.products says (kernels/cpu/tuning.hpp: packed at AVX-512 and OpenBLAS's
// otherwise unless a calibration chose the other); a test may set another, and the environment variable LATTN_LAYER_PRODUCTS=openblas|packed overrides both (for
// A/B runs of one build).
enum class ProductPath { openblas, packed };
ProductPath product_path();
// A path set by a test; the environment variable still wins. nullopt: back to the default.
void set_product_path(std::optional<ProductPath> path);
// What the layer's records and the device block name: "openblas" or "packed_<micro-kernel>".
std::string product_path_name();

// C = A op(B) + beta C (m x n, row-major) through product_path(); its scratch, exact.
std::size_t layer_product_bytes(int m, int n, int k);
void layer_product(bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float beta,
                   float* C, int ldc, Allocator& allocator);
// C = A^T B as k_split_product computes it (C's columns to `outs` in groups of `out_cols`) through
// product_path(); its scratch, exact.
std::size_t layer_weight_product_bytes(int m, int n, int k, int out_cols);
void layer_weight_product(int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* const* outs,
                          int out_cols, Allocator& allocator);

// bf16 products on AMX tiles (cpu/amx_products.cpp), on the tiles amx_path() names (the CPU's, or
// the emulation's where a test forces it; kernels/linear_attention/cpu/bf16.hpp):
// C = op(A) op(B) + beta C (m x n, row-major; op(A) m x k, op(B) k x n), A and B float32 with every
// element rounded to bf16 (to nearest even) as it is packed, the tile products accumulating in
// float32, then beta C added in float32. op(B) is packed once for all threads; the threads take
// blocks of 32 rows of C. Its scratch, exact: amx_product_bytes.
std::size_t amx_product_bytes(int m, int n, int k);
void amx_product(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                 float beta, float* C, int ldc, Allocator& allocator);
// The same product handing each block of C's rows (rows r0 .. r0 + rows - 1, `ld` floats a row) to
// `sink` on the thread that computed it, instead of writing C; amx_product_bytes too.
using AmxRowSink = std::function<void(int r0, int rows, const float* block, std::size_t ld)>;
void amx_product_rows(bool trans_a, bool trans_b, int m, int n, int k, const float* A, int lda, const float* B, int ldb,
                      const AmxRowSink& sink, Allocator& allocator);

// A bf16 layer case (x and dOut bf16, as the op stores them) runs on AMX tiles only: every product
// through amx_product, and a chunked linear branch through the AMX row of the bf16 chunked table
// that takes the branch's problem (chunked_amx, chunked_amx_gated, chunked_amx_delta:
// cpu_amx_chunked_variant); a scan branch stays float32. Why a case cannot run so here (no AMX-BF16,
// or no AMX row takes its chunked branch), or nothing; the chunked branch's row (throws where there
// is none); the name its records carry ("products amx", with ", linear <row>" where chunked).
std::optional<std::string> layer_amx_refusal(const LayerProblem& problem);
CpuBf16Variant layer_amx_linear(const LayerProblem& problem);
std::string layer_amx_variant_name(const LayerProblem& problem);
// The chunked branch on that row: q, k, v (and dO) rounded to bf16 into scratch, then the row's
// forward (keeping no chunk states) or its backward (recomputing them); their scratch, exact.
std::size_t amx_linear_forward_bytes(const CpuBf16Variant& row, const Problem& p);
void amx_linear_forward(const CpuBf16Variant& row, const Problem& p, const ForwardArgs<float>& args,
                        Allocator& allocator);
std::size_t amx_linear_backward_bytes(const CpuBf16Variant& row, const Problem& p);
void amx_linear_backward(const CpuBf16Variant& row, const Problem& p, const BackwardArgs<float>& args,
                         Allocator& allocator);

}  // namespace lattn::cpu
