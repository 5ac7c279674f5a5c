// The CUDA backend's kernel variants of the linear-attention op, one table per form
// (variants.cpp). scan_forward and scan_backward (kernels.hpp) run the first row of the scan
// table that takes the problem; the backend's impl rows skip a case no row takes with the table's
// reason. What a device cannot hold (the chunked tiles' shared memory) is the row's to decline
// (device_limits).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "core/workspace.hpp"
#include "kernels/cuda/dtype.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/linear_attention/variants.hpp"

namespace lattn::cuda {

// kept: the chunk states a forward leaves for the backward (kept_states_bytes of device memory), or
// null; a variant without kept_states_bytes takes null only.
struct CudaVariant {
  std::string name;  // what records and --list-cases show
  VariantTakes takes;
  void (*forward)(const Problem&, Dtype, const DeviceForward&, Allocator&, cudaStream_t, void* kept) = nullptr;
  void (*backward)(const Problem&, Dtype, const DeviceBackward&, Allocator&, cudaStream_t, const void* kept) = nullptr;
  // What a call takes from the allocator, in closed form (the tests hold the kernels to it).
  std::size_t (*forward_workspace_bytes)(const Problem&, Dtype) = nullptr;
  std::size_t (*backward_workspace_bytes)(const Problem&, Dtype, bool kept) = nullptr;
  std::size_t (*kept_states_bytes)(const Problem&, Dtype) = nullptr;
  // Why the device (its opt-in shared memory per block) cannot run a problem the row takes, or
  // nothing; null: any device that runs the backend can.
  std::optional<std::string> (*device_limits)(const Problem&, Dtype, std::size_t max_shared_bytes) = nullptr;
};

// The device kernels' arguments from the op's one binder (kernels/linear_attention/op.hpp).
inline DeviceForward device_forward_args(const LinearTensors& t) {
  return {t.q, t.k, t.v, t.h0, t.o, t.hT, t.g, t.beta, t.a, t.b, t.dt, t.trap, t.u};
}
inline DeviceBackward device_backward_args(const LinearTensors& t) {
  return {t.q,  t.k,    t.v,     t.h0, t.dO,  t.dhT,   t.dq,  t.dk, t.dv, t.dh0,  t.g,   t.dg,
          t.beta, t.dbeta, t.a, t.b, t.da, t.db, t.dt, t.trap, t.ddt, t.dtrap, t.u, t.du};
}

// The table of `form` ("scan" or "chunked"); empty for any other name.
const std::vector<CudaVariant>& cuda_variants(const std::string& form);

// The row of `form`'s table that runs `problem`, or null with `why` set to the table's reason.
const CudaVariant* cuda_variant(const std::string& form, const Problem& problem, std::string* why = nullptr);

// The row that runs `problem`; throws RuntimeFailure with the table's reason when none does.
const CudaVariant& cuda_variant_for(const std::string& form, const Problem& problem);

}  // namespace lattn::cuda
