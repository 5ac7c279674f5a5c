// The row moves of DeltaProduct's rows (cuda/householder.hpp): q, the gates and dO spread to the
// interleaved steps, o, dq and dg picked back. Plain copies, a grid-stride loop over the
// destination's elements; float32 rows as floats, bf16 rows as their 16-bit patterns (a zero
// pattern is bf16's zero).
#include "kernels/linear_attention/cuda/householder.hpp"

#include <algorithm>
#include <stdexcept>

#include "kernels/cuda/check.hpp"

namespace lattn::cuda {
namespace {

template <class T>
__global__ void interleave_kernel(const T* src, long rows, long width, int n, int at, T* dst) {
  const long total = rows * n * width;
  for (long e = long(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += long(gridDim.x) * blockDim.x) {
    const long row = e / width, column = e - row * width;
    const long r = row / n;
    dst[e] = row - r * n == at ? src[r * width + column] : T(0);
  }
}

template <class T>
__global__ void pick_kernel(const T* src, long rows, long width, int n, int at, T* dst) {
  const long total = rows * width;
  for (long e = long(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += long(gridDim.x) * blockDim.x) {
    const long r = e / width, column = e - r * width;
    dst[e] = src[(r * n + at) * width + column];
  }
}

constexpr unsigned kThreads = 256;

unsigned blocks_for(long elements) {
  return unsigned(std::min<long>((elements + kThreads - 1) / kThreads, 4096));
}

void check_element(std::size_t element_bytes) {
  if (element_bytes != 2 && element_bytes != 4)
    throw std::logic_error("householder rows: elements of 2 or 4 bytes only, not " + std::to_string(element_bytes));
}

}  // namespace

void interleave_rows(const void* src, std::size_t rows, std::size_t width, std::size_t element_bytes, int n, int at,
                     void* dst, cudaStream_t stream) {
  check_element(element_bytes);
  const long total = long(rows) * n * long(width);
  if (total == 0) return;
  if (element_bytes == 4)
    interleave_kernel<float><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const float*>(src), long(rows), long(width), n, at, static_cast<float*>(dst));
  else
    interleave_kernel<unsigned short><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const unsigned short*>(src), long(rows), long(width), n, at, static_cast<unsigned short*>(dst));
  LATTN_CUDA_CHECK_LAUNCH();
}

void pick_rows(const void* src, std::size_t rows, std::size_t width, std::size_t element_bytes, int n, int at,
               void* dst, cudaStream_t stream) {
  check_element(element_bytes);
  const long total = long(rows) * long(width);
  if (total == 0) return;
  if (element_bytes == 4)
    pick_kernel<float><<<blocks_for(total), kThreads, 0, stream>>>(static_cast<const float*>(src), long(rows),
                                                                    long(width), n, at, static_cast<float*>(dst));
  else
    pick_kernel<unsigned short><<<blocks_for(total), kThreads, 0, stream>>>(
        static_cast<const unsigned short*>(src), long(rows), long(width), n, at, static_cast<unsigned short*>(dst));
  LATTN_CUDA_CHECK_LAUNCH();
}

}  // namespace lattn::cuda
