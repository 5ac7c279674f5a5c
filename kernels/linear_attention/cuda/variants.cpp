// The CUDA backend's variants of the linear-attention op: which kernel runs which (rule, decay) in
// each form, and the scan's entry points of kernels.hpp, which ask the table. Rows are tried in order.
// The chunked rows: `chunked` takes the additive rule with decay none or retnet and `chunked_gated`
// with scalar or vector gates, both on the gated chunked kernels (cuda/chunked_gated.hpp; none and
// retnet as fixed log-gates per head, no g read) and every shape of docs/spec.md section 1c; `chunked_delta` the delta rule's WY
// form, every decay and every shape (cuda/chunked_delta.hpp). The scan rows take every rule, decay
// and shape. The trapezoidal rule (decay scalar) runs on the additive rule's rows as inner rows
// (cuda/trapezoidal.hpp): `scan_trapezoidal` on the scan, `chunked_trapezoidal` on the gated chunked kernels.
#include "kernels/linear_attention/cuda/variants.hpp"

#include "core/error.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/trapezoidal.hpp"

namespace lattn::cuda {
namespace {

constexpr Decay kAllDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};
const std::vector<Decay> all_decays(std::begin(kAllDecays), std::end(kAllDecays));

// The scan rows take section 1c's shapes as they are (cuda/scan_shapes.cuh).
std::vector<CudaVariant> scan_table() {
  return {
      {"scan_delta", {{Rule::delta}, all_decays, scan_unsupported, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void*) {
         scan_delta_forward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void*) {
         scan_delta_backward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype) { return scan_delta_forward_workspace_bytes(p); },
       [](const Problem& p, Dtype, bool) { return scan_delta_backward_workspace_bytes(p); }},
      {"scan", {{Rule::additive}, all_decays, scan_unsupported, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void*) {
         scan_additive_forward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void*) {
         scan_additive_backward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype) { return scan_additive_forward_workspace_bytes(p); },
       [](const Problem& p, Dtype, bool) { return scan_additive_backward_workspace_bytes(p); }},
      // The trapezoidal rule on the scan row (cuda/trapezoidal.hpp).
      {"scan_trapezoidal", {{Rule::trapezoidal}, {Decay::scalar}, trapezoidal_scan_limits, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void*) {
         trapezoidal_forward(TrapezoidalInner::scan, p, d, a, m, s);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void*) {
         trapezoidal_backward(TrapezoidalInner::scan, p, d, a, m, s);
       },
       [](const Problem& p, Dtype d) { return trapezoidal_forward_workspace_bytes(TrapezoidalInner::scan, p, d); },
       [](const Problem& p, Dtype d, bool) {
         return trapezoidal_backward_workspace_bytes(TrapezoidalInner::scan, p, d, false);
       }},
  };
}

std::vector<CudaVariant> chunked_table() {
  return {
      {"chunked", {{Rule::additive}, {Decay::none, Decay::retnet}, nullptr, true}, chunked_gated_forward,
       chunked_gated_backward, chunked_gated_forward_workspace_bytes, chunked_gated_backward_workspace_bytes,
       chunked_gated_states_bytes, chunked_gated_unsupported},
      {"chunked_gated", {{Rule::additive}, {Decay::scalar, Decay::vector}, nullptr, true}, chunked_gated_forward,
       chunked_gated_backward, chunked_gated_forward_workspace_bytes, chunked_gated_backward_workspace_bytes,
       chunked_gated_states_bytes, chunked_gated_unsupported},
      // The delta rule's WY form (cuda/chunked_delta*.cu): section 1c's shapes as they are.
      {"chunked_delta", {{Rule::delta}, all_decays, chunked_delta_limits, true}, chunked_delta_forward,
       chunked_delta_backward, chunked_delta_forward_workspace_bytes, chunked_delta_backward_workspace_bytes,
       chunked_delta_kept_bytes, chunked_delta_unsupported},
      // The trapezoidal rule on the chunked_gated row (cuda/trapezoidal.hpp), its chunk states kept as that row's.
      {"chunked_trapezoidal", {{Rule::trapezoidal}, {Decay::scalar}, trapezoidal_chunked_limits, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void* kept) {
         trapezoidal_forward(TrapezoidalInner::chunked, p, d, a, m, s, kept);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void* kept) {
         trapezoidal_backward(TrapezoidalInner::chunked, p, d, a, m, s, kept);
       },
       [](const Problem& p, Dtype d) { return trapezoidal_forward_workspace_bytes(TrapezoidalInner::chunked, p, d); },
       [](const Problem& p, Dtype d, bool kept) {
         return trapezoidal_backward_workspace_bytes(TrapezoidalInner::chunked, p, d, kept);
       },
       trapezoidal_kept_bytes, trapezoidal_chunked_unsupported},
  };
}

}  // namespace

const std::vector<CudaVariant>& cuda_variants(const std::string& form) {
  static const std::vector<CudaVariant> scan = scan_table(), chunked = chunked_table(), none;
  return form == "scan" ? scan : form == "chunked" ? chunked : none;
}

const CudaVariant* cuda_variant(const std::string& form, const Problem& problem, std::string* why) {
  return choose_variant(cuda_variants(form), problem, "CUDA " + form, why);
}

const CudaVariant& cuda_variant_for(const std::string& form, const Problem& problem) {
  std::string why;
  if (const CudaVariant* v = cuda_variant(form, problem, &why)) return *v;
  throw RuntimeFailure(why);
}

// ---- kernels.hpp's scan entry points ----

void scan_forward(const Problem& p, Dtype dtype, const DeviceForward& a, Allocator& allocator, cudaStream_t stream) {
  cuda_variant_for("scan", p).forward(p, dtype, a, allocator, stream, nullptr);
}

void scan_backward(const Problem& p, Dtype dtype, const DeviceBackward& a, Allocator& allocator, cudaStream_t stream) {
  cuda_variant_for("scan", p).backward(p, dtype, a, allocator, stream, nullptr);
}

std::size_t scan_forward_workspace_bytes(const Problem& p) {
  return cuda_variant_for("scan", p).forward_workspace_bytes(p, Dtype::f32);
}

std::size_t scan_backward_workspace_bytes(const Problem& p) {
  return cuda_variant_for("scan", p).backward_workspace_bytes(p, Dtype::f32, false);
}

}  // namespace lattn::cuda
