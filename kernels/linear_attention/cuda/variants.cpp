// The CUDA backend's variants of the linear-attention op: which kernel runs which (rule, decay) in
// each form, and the scan's entry points of kernels.hpp, which ask the table. Rows are tried in order.
// The chunked rows: `chunked` takes the additive rule with decay none or retnet and `chunked_gated`
// with scalar or vector gates, both on the gated chunked kernels (cuda/chunked_gated.hpp; none and
// retnet as fixed log-gates per head, no g read) and every shape of docs/spec.md section 1c; `chunked_delta` the delta rule's WY
// form, every decay and every shape (cuda/chunked_delta.hpp); no chunked row takes the dplr rule yet.
// The scan rows (`scan_delta`, `scan_dplr`, `scan`) take the additive, delta and dplr rules, every
// decay and shape.
// RWKV-6's bonus: the additive scan row (vector gates); the chunked rows decline it. DeltaProduct
// (householder n > 1): each table's delta row over the interleaved steps (`Householder`, below).
#include "kernels/linear_attention/cuda/variants.hpp"

#include "core/error.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/householder.hpp"
#include "kernels/linear_attention/householder.hpp"

namespace lattn::cuda {
namespace {

constexpr Decay kAllDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};
const std::vector<Decay> all_decays(std::begin(kAllDecays), std::end(kAllDecays));

// RWKV-6's bonus form (docs/spec.md section 1g): the additive scan computes it with vector gates only.
std::optional<std::string> scan_additive_limits(const Problem& p) {
  if (p.bonus && p.decay != Decay::vector) return std::string("the bonus form with vector gates only");
  return scan_unsupported(p);
}

// DeltaProduct's rows (cuda/householder.hpp): the delta rule's row of table `Form` that takes
// householder_steps(problem) runs it, over q, the gates and dO spread to the steps in scratch (q and
// dO in the token dtype, the gates float32), then o, dq and dg are picked back. Scratch: the steps'
// q, g and o (forward); q, dO, dq, g and dg (backward); each a block of its own, beside the inner row's.
template <const char* Form>
struct Householder {
  static const CudaVariant& inner(const Problem& p) { return cuda_variant_for(Form, householder_steps(p)); }
  static std::size_t token_bytes(Dtype d) { return d == Dtype::bf16 ? 2 : 4; }
  static std::size_t key_rows(const Problem& p) { return p.key_elems() / std::size_t(p.dim); }
  static std::size_t value_rows(const Problem& p) { return p.heads_total() * std::size_t(p.seq); }

  static std::optional<std::string> limits(const Problem& p) {
    if (p.householder <= 1) return std::string("n > 1 Householder writes per token only");
    std::string why;
    if (!cuda_variant(Form, householder_steps(p), &why)) return why;
    return std::nullopt;
  }
  static std::optional<std::string> device_limits(const Problem& p, Dtype d, std::size_t shared) {
    const CudaVariant& in = inner(p);
    return in.device_limits ? in.device_limits(householder_steps(p), d, shared) : std::nullopt;
  }
  static void forward(const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t st, void* kept) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    Workspace<unsigned char> q(m, s.key_elems() * token_bytes(d));
    Workspace<float> g(m, s.gate_elems()), o(m, s.value_elems());
    interleave_rows(a.q, key_rows(p), p.dim, token_bytes(d), n, n - 1, q.data(), st);
    if (a.g) interleave_rows(a.g, value_rows(p), W, sizeof(float), n, 0, g.data(), st);
    DeviceForward steps = a;
    steps.q = q.data(), steps.o = o.data(), steps.g = a.g ? g.data() : nullptr;
    inner(p).forward(s, d, steps, m, st, kept);
    pick_rows(o.data(), value_rows(p), p.value_dim(), sizeof(float), n, n - 1, a.o, st);
  }
  static void backward(const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t st,
                       const void* kept) {
    const Problem s = householder_steps(p);
    const int n = p.householder, W = p.gate_width();
    Workspace<unsigned char> q(m, s.key_elems() * token_bytes(d)), dO(m, s.value_elems() * token_bytes(d));
    Workspace<float> dq(m, s.key_elems()), g(m, s.gate_elems()), dg(m, s.gate_elems());
    interleave_rows(a.q, key_rows(p), p.dim, token_bytes(d), n, n - 1, q.data(), st);
    interleave_rows(a.dO, value_rows(p), p.value_dim(), token_bytes(d), n, n - 1, dO.data(), st);
    if (a.g) interleave_rows(a.g, value_rows(p), W, sizeof(float), n, 0, g.data(), st);
    DeviceBackward steps = a;
    steps.q = q.data(), steps.dO = dO.data(), steps.dq = dq.data();
    steps.g = a.g ? g.data() : nullptr, steps.dg = a.dg ? dg.data() : nullptr;
    inner(p).backward(s, d, steps, m, st, kept);
    pick_rows(dq.data(), key_rows(p), p.dim, sizeof(float), n, n - 1, a.dq, st);
    if (a.dg) pick_rows(dg.data(), value_rows(p), W, sizeof(float), n, 0, a.dg, st);
  }
  static std::size_t forward_bytes(const Problem& p, Dtype d) {
    const Problem s = householder_steps(p);
    return s.key_elems() * token_bytes(d) + (s.gate_elems() + s.value_elems()) * sizeof(float) +
           inner(p).forward_workspace_bytes(s, d);
  }
  static std::size_t backward_bytes(const Problem& p, Dtype d, bool kept) {
    const Problem s = householder_steps(p);
    return (s.key_elems() + s.value_elems()) * token_bytes(d) + (s.key_elems() + 2 * s.gate_elems()) * sizeof(float) +
           inner(p).backward_workspace_bytes(s, d, kept);
  }
  static std::size_t kept_bytes(const Problem& p, Dtype d) { return inner(p).kept_states_bytes(householder_steps(p), d); }

  // The row: the delta rule's decays but retnet's, whose gamma would act at every step (the op declines it).
  static CudaVariant row(const std::string& name, bool keeps_states) {
    return {name + "+householder",
            {{Rule::delta}, {Decay::none, Decay::scalar, Decay::vector}, limits, true, false, true},
            forward, backward, forward_bytes, backward_bytes, keeps_states ? &kept_bytes : nullptr, device_limits};
  }
};
constexpr char kScanForm[] = "scan";
constexpr char kChunkedForm[] = "chunked";

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
      Householder<kScanForm>::row("scan_delta", false),
      {"scan_dplr", {{Rule::dplr}, all_decays, scan_unsupported, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void*) {
         scan_dplr_forward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void*) {
         scan_dplr_backward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype) { return scan_dplr_forward_workspace_bytes(p); },
       [](const Problem& p, Dtype, bool) { return scan_dplr_backward_workspace_bytes(p); }},
      {"scan", {{Rule::additive}, all_decays, scan_additive_limits, true, true},
       [](const Problem& p, Dtype d, const DeviceForward& a, Allocator& m, cudaStream_t s, void*) {
         scan_additive_forward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype d, const DeviceBackward& a, Allocator& m, cudaStream_t s, const void*) {
         scan_additive_backward(p, d, a, m, s);
       },
       [](const Problem& p, Dtype) { return scan_additive_forward_workspace_bytes(p); },
       [](const Problem& p, Dtype, bool) { return scan_additive_backward_workspace_bytes(p); }},
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
      Householder<kChunkedForm>::row("chunked_delta", true),
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
