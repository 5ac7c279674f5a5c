// The element type of the CUDA kernels' token tensors (q, k, v, dO): float32, or bf16 as raw
// 16-bit patterns. States, outputs and accumulators are float32 either way.
#pragma once

namespace lattn::cuda {

enum class Dtype { f32, bf16 };

}  // namespace lattn::cuda
