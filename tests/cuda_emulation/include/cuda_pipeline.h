// Stand-in for the CUDA toolkit's cuda_pipeline.h (its primitives interface, the one the project
// uses for cp.async): asynchronous copies from global to shared memory, committed in groups and
// waited for by the thread that issued them. Here a copy is done as late as CUDA allows, when its
// thread waits for its group (tests/cuda_emulation/pipeline.cpp): a thread that reads the
// destination before its wait, or another thread that reads it before a barrier that follows the
// wait, sees the old contents (NaN in fresh shared memory), as it may on a GPU. Sizes 4, 8 and 16
// bytes with both pointers aligned to the size, and zfill at most the size, as CUDA requires.
#pragma once

#include <cstddef>

void __pipeline_memcpy_async(void* dst_shared, const void* src_global, std::size_t size_and_align,
                             std::size_t zfill = 0);
void __pipeline_commit();
void __pipeline_wait_prior(std::size_t prior);
