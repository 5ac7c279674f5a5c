// The CUDA declaration qualifiers, for host compilation of device code. Device and host code are
// the same machine code here, so __device__, __host__ and __global__ say nothing; __shared__ is
// not defined at all: the build step (tests/cuda_emulation/emulate_cu.cmake) rewrites every
// __shared__ declaration of a .cu into shared-memory storage of the emulated block, and a
// __shared__ it did not rewrite (one in a header, say) then fails to compile rather than becoming
// memory private to each thread. __launch_bounds__ is rewritten there too (it becomes part of the
// kernel's tag, which the launcher checks); this definition only serves headers that use it.
#pragma once

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
// GCC and Clang accept __restrict__ themselves, with the meaning CUDA gives it.
