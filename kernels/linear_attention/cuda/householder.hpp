// DeltaProduct (docs/spec.md section 1h) on the GPU: the delta rule's rows over the interleaved
// seq * n steps (kernels/linear_attention/householder.hpp), as the CPU's adapter
// (cpu/householder.cpp) runs them. cuda/householder.cu moves the rows between the two layouts on
// the device; the rows of the scan and chunked tables that take householder n > 1
// (cuda/variants.cpp) spread q, the gates and dO to the steps in scratch, read k, v and beta in
// place, and pick o, dq and dg back. Tests: tests/cuda_emulation/test_householder_bonus.cpp.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace lattn::cuda {

// On the device, `rows` rows of `width` elements of `element_bytes` (2 or 4) each: row r of src to
// row r n + at of dst (rows * n rows), every other row of dst zero (interleave_rows), or row
// r n + at of src to row r of dst (pick_rows). Enqueued on `stream`.
void interleave_rows(const void* src, std::size_t rows, std::size_t width, std::size_t element_bytes, int n, int at,
                     void* dst, cudaStream_t stream);
void pick_rows(const void* src, std::size_t rows, std::size_t width, std::size_t element_bytes, int n, int at,
               void* dst, cudaStream_t stream);

}  // namespace lattn::cuda
