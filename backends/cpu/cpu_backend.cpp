// The CPU backend's table: one row per (op, form) it runs, each binding the case's buffers to the
// CPU kernels of kernels/<op>/ (cpu.cpp, or cpu/) once, and the device block with the roofline measured at
// start-up. OpenMP runs the kernels' outer loops on the run's threads; BLAS stays single-threaded
// inside them.
#include "backends/cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <map>
#include <stdexcept>

#include "backends/cpu/cold.hpp"
#include "backends/cpu/decode_case.hpp"
#include "backends/cpu/host_case.hpp"
#include "backends/cpu/plugin_rows.hpp"
#include "backends/cpu/roofline.hpp"
#include "backends/cpu/tuning.hpp"
#include "core/op.hpp"
#include "kernels/cpu/amx_counted.hpp"
#include "kernels/cpu/vec.hpp"
#include "kernels/decode/op.hpp"
#include "kernels/layer/block/cpu.hpp"
#include "kernels/layer/hybrid/cpu.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/cpu.hpp"
#include "src/results/build_info.hpp"
#include "src/results/environment.hpp"

namespace lattn::cpu {
namespace {

struct Settings {
  int threads = 1;
  bool keep_chunk_states = true;
};

// ---- linear attention (kernels/linear_attention) ----

// The case's tensors bound by name through the op's one binder (kernels/linear_attention/op.hpp):
// a bf16 case's q, k, v and dO are bf16.
LinearTensors bound_tensors(HostCase& h, const Case& c) {
  return bind_linear_tensors(c, [&h](const std::string& name) -> void* { return h.raw_data(name); });
}

Bf16ForwardArgs bf16_forward_args(const LinearTensors& t) {
  const auto b = [](void* p) { return static_cast<const Bf16*>(p); };
  return {b(t.q), b(t.k), b(t.v), t.h0, t.o, t.hT, t.g, t.beta, t.a, t.b, t.dt, t.trap, t.u};
}

Bf16BackwardArgs bf16_backward_args(const LinearTensors& t) {
  const auto b = [](void* p) { return static_cast<const Bf16*>(p); };
  return {b(t.q), b(t.k), b(t.v), t.h0, b(t.dO), t.dhT, t.dq, t.dk, t.dv, t.dh0, t.g, t.dg, t.beta, t.dbeta,
          t.a, t.b, t.da, t.db, t.dt, t.trap, t.ddt, t.dtrap, t.u, t.du};
}

bool is_bf16(const Case& c) { return c.dtype == "bf16"; }

// The form's variant table decides which kernel runs a case, and declines one it has no variant
// for (cpu/variants.cpp; cpu/bf16_variants.cpp for bf16 cases, declined where the CPU lacks
// AVX512-BF16); any other dtype is the backend's to decline.
void ask_variant_table(ImplRow& row, const std::string& form) {
  row.unsupported = [form](const Case& c) -> std::optional<std::string> {
    if (is_bf16(c)) return cpu_bf16_refusal(form, linear_problem(c));
    if (auto why = cpu_dtype_unsupported(c)) return why;
    std::string why;
    if (!cpu_variant(form, linear_problem(c), &why)) return why;
    return std::nullopt;
  };
  row.variant = [form](const Case& c) {
    if (!is_bf16(c)) return cpu_variant_for(form, linear_problem(c)).name;
    const CpuBf16Variant v = cpu_bf16_variant_for(form, linear_problem(c));
    return c.backward() && !v.backward_name.empty() ? v.name + "/" + v.backward_name : v.name;
  };
}

// A form's kernels in the case's dtype, bound to its buffers: the forward (taking `keep`, the kept
// chunk states, or null) and the backward (taking them as `kept`).
struct BoundCalls {
  std::function<void(Allocator&, float* keep)> forward;
  std::function<void(Allocator&, const float* kept)> backward;
  std::function<std::size_t(const Problem&)> kept_states_bytes;
};

BoundCalls bound_calls(const std::string& form, HostCase& h, const Case& c, const Problem& p) {
  const LinearTensors tensors = bound_tensors(h, c);
  if (is_bf16(c)) {
    const CpuBf16Variant v = cpu_bf16_variant_for(form, p);
    const Bf16ForwardArgs fwd = bf16_forward_args(tensors);
    const Bf16BackwardArgs bwd = bf16_backward_args(tensors);
    return {[p, fwd, f = v.forward](Allocator& a, float* keep) { f(p, fwd, a, keep); },
            [p, bwd, b = v.backward](Allocator& a, const float* kept) { b(p, bwd, a, kept); }, v.kept_states_bytes};
  }
  const CpuVariant v = cpu_variant_for(form, p);
  const ForwardArgs<float> fwd = cpu_forward_args(tensors);
  const BackwardArgs<float> bwd = cpu_backward_args(tensors);
  return {[p, fwd, f = v.forward](Allocator& a, float* keep) { f(p, fwd, a, keep); },
          [p, bwd, b = v.backward](Allocator& a, const float* kept) { b(p, bwd, a, kept); }, v.kept_states_bytes};
}

// Peak scratch of a form's call in the case's dtype (keep: the forward keeps the chunk states).
std::size_t forward_scratch(const std::string& form, const Case& c, const Problem& p, bool keep) {
  return is_bf16(c) ? cpu_bf16_variant_for(form, p).forward_workspace_bytes(p, keep)
                    : cpu_variant_for(form, p).forward_workspace_bytes(p, keep);
}
std::size_t backward_scratch(const std::string& form, const Case& c, const Problem& p, bool kept) {
  return is_bf16(c) ? cpu_bf16_variant_for(form, p).backward_workspace_bytes(p, kept)
                    : cpu_variant_for(form, p).backward_workspace_bytes(p, kept);
}
std::size_t kept_states(const std::string& form, const Case& c, const Problem& p) {
  const auto& bytes = is_bf16(c) ? cpu_bf16_variant_for(form, p).kept_states_bytes
                                 : cpu_variant_for(form, p).kept_states_bytes;
  return bytes ? bytes(p) : 0;
}

// A training step: the whole forward, then the backward from what it saved. dO and dhT stand for
// gradients that arrive after the forward (docs/spec.md section 1), so no forward reads them.
ImplRow scan_row() {
  ImplRow row{"linear_attention", "scan", nullptr, nullptr, nullptr};
  ask_variant_table(row, "scan");
  row.prepare = [](const Case& c, const TensorSet& inputs) {
    auto h = std::make_unique<HostCase>(c, inputs);
    const Problem p = linear_problem(c);
    const BoundCalls calls = bound_calls("scan", *h, c, p);
    if (!c.backward()) {
      h->bind([forward = calls.forward](Allocator& a) { forward(a, nullptr); });
      return std::unique_ptr<PreparedCase>(std::move(h));
    }
    h->bind([forward = calls.forward, backward = calls.backward](Allocator& a) {
      forward(a, nullptr);
      backward(a, nullptr);
    });
    return std::unique_ptr<PreparedCase>(std::move(h));
  };
  row.memory_estimate = [](const Case& c) {
    const Problem p = linear_problem(c);
    const std::size_t fwd = forward_scratch("scan", c, p, false);
    const std::size_t scratch = c.backward() ? std::max(fwd, backward_scratch("scan", c, p, false)) : fwd;
    return host_tensor_bytes(c) + scratch;
  };
  return row;
}

// The backward takes the chunk states the forward kept, as a training step would, unless the run
// asked for them recomputed (less memory) or the path cannot keep them.
ImplRow chunked_row(const Settings& s) {
  ImplRow row{"linear_attention", "chunked", nullptr, nullptr, nullptr};
  ask_variant_table(row, "chunked");
  row.prepare = [s](const Case& c, const TensorSet& inputs) {
    auto h = std::make_unique<HostCase>(c, inputs);
    const Problem p = linear_problem(c);
    const BoundCalls calls = bound_calls("chunked", *h, c, p);
    if (!c.backward()) {
      h->bind([forward = calls.forward](Allocator& a) { forward(a, nullptr); });
      return std::unique_ptr<PreparedCase>(std::move(h));
    }
    const std::size_t kept_bytes = s.keep_chunk_states && calls.kept_states_bytes ? calls.kept_states_bytes(p) : 0;
    h->bind(
        [kept_bytes, forward = calls.forward, backward = calls.backward](Allocator& a) {
          Workspace<float> kept(a, kept_bytes / sizeof(float));
          forward(a, kept.data());
          backward(a, kept.data());
        },
        kept_bytes > 0 ? "kept" : "recomputed");
    return std::unique_ptr<PreparedCase>(std::move(h));
  };
  row.memory_estimate = [s](const Case& c) {
    const Problem p = linear_problem(c);
    std::size_t scratch = forward_scratch("chunked", c, p, false);
    if (c.backward()) {
      const std::size_t kept = s.keep_chunk_states ? kept_states("chunked", c, p) : 0;
      scratch = kept + std::max(forward_scratch("chunked", c, p, kept > 0), backward_scratch("chunked", c, p, kept > 0));
    }
    return host_tensor_bytes(c) + scratch;
  };
  return row;
}

// ---- sliding-window attention (kernels/sliding_window) ----

ImplRow window_row() {
  ImplRow row{"sliding_window", "blocked", cpu_dtype_unsupported, nullptr, nullptr};
  row.prepare = [](const Case& c, const TensorSet& inputs) {
    auto h = std::make_unique<HostCase>(c, inputs);
    const Problem p{c.batch, c.heads, c.seq, c.dim, 1, Decay::none};
    const int window = c.window;
    const SlidingWindowForwardArgs fwd{h->data("q"), h->data("k"), h->data("v"), h->data("o"), nullptr};
    if (!c.backward()) {
      h->bind([p, window, fwd](Allocator& a) { sliding_window_forward(p, window, fwd, a); });
      return std::unique_ptr<PreparedCase>(std::move(h));
    }
    const SlidingWindowBackwardArgs bwd{h->data("q"),  h->data("k"),  h->data("v"),  h->data("o"), nullptr,
                                        h->data("dO"), h->data("dq"), h->data("dk"), h->data("dv"), false};
    // The forward's per-row log-sum-exp is what the backward reads instead of a saved P: scratch.
    h->bind([p, window, fwd, bwd](Allocator& a) {
      Workspace<float> lse(a, p.heads_total() * std::size_t(p.seq));
      SlidingWindowForwardArgs f = fwd;
      SlidingWindowBackwardArgs b = bwd;
      f.lse = lse.data();
      b.lse = lse.data();
      sliding_window_forward(p, window, f, a);
      sliding_window_backward(p, window, b, a);
    });
    return std::unique_ptr<PreparedCase>(std::move(h));
  };
  row.memory_estimate = [](const Case& c) {
    const Problem p{c.batch, c.heads, c.seq, c.dim, 1, Decay::none};
    const std::size_t fwd = sliding_window_forward_workspace_bytes(p, c.window);
    const std::size_t scratch =
        c.backward() ? p.heads_total() * std::size_t(p.seq) * sizeof(float) +
                           std::max(fwd, sliding_window_backward_workspace_bytes(p, c.window))
                     : fwd;
    return host_tensor_bytes(c) + scratch;
  };
  return row;
}

// ---- the layer (kernels/layer): one row per form of its linear branch ----

// A bf16 case runs on AMX tiles only (kernels/layer/cpu/products.hpp), declined with the reason
// where the CPU has no AMX-BF16 or no AMX row takes its chunked branch; its x and dOut are bf16.
std::optional<std::string> layer_unsupported(const Case& c, const Settings& s) {
  if (!is_bf16(c)) return cpu_dtype_unsupported(c);
  if (layer_problem(c).linear.trapezoidal()) return std::string("the Mamba-3 block (rule trapezoidal) runs float32 only");
  if (auto why = layer_amx_refusal(layer_problem(c, s.keep_chunk_states)))
    return "the CPU layer runs bf16 on AMX tiles only: " + *why;
  return std::nullopt;
}

ImplRow layer_row(const std::string& form, const Settings& s) {
  ImplRow row{"layer", form, nullptr, nullptr, nullptr};
  row.unsupported = [s](const Case& c) { return layer_unsupported(c, s); };
  row.prepare = [s](const Case& c, const TensorSet& inputs) {
    auto h = std::make_unique<HostCase>(c, inputs);
    const LayerProblem p = layer_problem(c, s.keep_chunk_states);
    const bool bf16 = is_bf16(c);
    // bf16: x and dOut as the op stores them; the float32 args' x and dOut stay null.
    const LayerBf16Tokens tokens{bf16 ? h->bf16_data("x") : nullptr,
                                 bf16 && c.backward() ? h->bf16_data("dOut") : nullptr};
    const auto tensor = [&](const std::string& name) -> float* {
      return bf16 && (name == "x" || name == "dOut") ? nullptr : h->data(name);
    };
    if (p.modern()) {  // the block of docs/spec.md section 2b (kernels/layer/block/block.hpp)
      const BlockArgs<float> args = block::bind_args<float>([&](const char* name) -> float* {
        for (const TensorSpec& spec : c.op->tensors)
          if (spec.name == name && spec.in(c)) return tensor(name);
        return nullptr;
      });
      std::string states;
      if (p.chunked && c.backward()) states = !bf16 && block_kept_chunk_states_bytes(p) > 0 ? "kept" : "recomputed";
      if (c.backward() && bf16)
        h->bind([p, args, tokens](Allocator& a) { block_forward_backward_bf16(p, args, tokens, a); }, states);
      else if (c.backward())
        h->bind([p, args](Allocator& a) { block_forward_backward(p, args, a); }, states);
      else if (bf16)
        h->bind([p, args, tokens](Allocator& a) { block_forward_bf16(p, args, tokens, a); });
      else
        h->bind([p, args](Allocator& a) { block_forward(p, args, a); });
      return std::unique_ptr<PreparedCase>(std::move(h));
    }
    if (!c.backward()) {
      const LayerForwardArgs<float> fwd{tensor("x"), h->data("wq"), h->data("wk"),   h->data("wv"),
                                        h->data("wo"), h->data("g"),  h->data("beta"), h->data("out")};
      if (bf16)
        h->bind([p, fwd, tokens](Allocator& a) { layer_forward_bf16(p, fwd, tokens, a); });
      else
        h->bind([p, fwd](Allocator& a) { layer_forward(p, fwd, a); });
      return std::unique_ptr<PreparedCase>(std::move(h));
    }
    const LayerBackwardArgs<float> bwd{tensor("x"),    h->data("wq"),  h->data("wk"),  h->data("wv"),
                                       h->data("wo"),  h->data("g"),   h->data("beta"), tensor("dOut"),
                                       h->data("out"), h->data("dx"),  h->data("dwq"), h->data("dwk"),
                                       h->data("dwv"), h->data("dwo"), h->data("dg"),  h->data("dbeta")};
    std::string states;
    if (p.chunked) states = !bf16 && layer_kept_chunk_states_bytes(p) > 0 ? "kept" : "recomputed";
    if (bf16)
      h->bind([p, bwd, tokens](Allocator& a) { layer_forward_backward_bf16(p, bwd, tokens, a); }, states);
    else
      h->bind([p, bwd](Allocator& a) { layer_forward_backward(p, bwd, a); }, states);
    return std::unique_ptr<PreparedCase>(std::move(h));
  };
  // Which products ran: the hybrid block's follow product_path(), the modern block's are OpenBLAS's;
  // a bf16 case's are AMX's ("products amx", and the chunked branch's AMX row), so that its peak is
  // the AMX rate (DeviceInfo::peak_gflops_for).
  row.variant = [s](const Case& c) {
    const LayerProblem p = layer_problem(c, s.keep_chunk_states);
    if (is_bf16(c)) return layer_amx_variant_name(p);
    return "products " + (p.modern() ? std::string("openblas") : product_path_name());
  };
  row.memory_estimate = [s](const Case& c) {
    const LayerProblem p = layer_problem(c, s.keep_chunk_states);
    const bool bf16 = is_bf16(c);
    if (p.modern()) {
      if (bf16)
        return host_tensor_bytes(c) + (c.backward() ? block_forward_backward_bf16_workspace_bytes(p)
                                                    : block_forward_bf16_workspace_bytes(p));
      return host_tensor_bytes(c) +
             (c.backward() ? block_forward_backward_workspace_bytes(p) : block_forward_workspace_bytes(p));
    }
    if (bf16)
      return host_tensor_bytes(c) + (c.backward() ? layer_forward_backward_bf16_workspace_bytes(p)
                                                  : layer_forward_bf16_workspace_bytes(p));
    return host_tensor_bytes(c) +
           (c.backward() ? layer_forward_backward_workspace_bytes(p) : layer_forward_workspace_bytes(p));
  };
  return row;
}

// ---- the decode step (kernels/decode): the states are stepped in place, re-seeded from h0
// outside the timed region, and rotated over copies when cold (decode_case.hpp) ----

ImplRow decode_row(const Settings& s) {
  ImplRow row{"decode", "step", nullptr, nullptr, nullptr};
  row.unsupported = [](const Case& c) -> std::optional<std::string> {
    if (auto why = cpu_dtype_unsupported(c)) return why;
    if (c.backward()) return "the decode step is forward only";
    return std::nullopt;
  };
  row.prepare = make_decode_case;
  row.memory_estimate = [s](const Case& c) { return decode_case_bytes(c, s.threads); };
  return row;
}

CpuDeviceInfo describe_cpu(int threads, TuningMode tuning_mode) {
  CpuDeviceInfo info;
  // Before anything below runs a kernel or names one (layer_products names the micro-tile).
  info.tuning = apply_tuning(tuning_mode);
  info.blas = openblas_get_config();
  info.blas_version = OPENBLAS_VERSION;
  info.blas_threads_inside_kernels = 1;
  info.blas_core = openblas_get_corename();
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) info.blas_coretype_env = env;
  if (const char* detected = std::getenv("LATTN_OPENBLAS_DETECTED")) info.blas_core_detected = detected;
  const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
  info.omp_wait_policy = wait_policy ? wait_policy : "";
  if (const char* spin = std::getenv("GOMP_SPINCOUNT")) info.gomp_spincount = spin;
  if (const char* set = std::getenv("LATTN_ENV_SET")) info.env_set_by_lattnbench = set;
  info.scan_vector_width = to_string(active_vec());
  // The roofline every record's peak_fraction is taken against, measured once per process.
  const Roofline& roof = cpu_roofline(threads);
  info.sgemm_gflops = roof.sgemm_gflops;
  info.sgemm_n = roof.sgemm_n;
  info.sgemm_threads = roof.threads;
  info.sgemm_products = roof.sgemm_products;
  info.sgemm_median_gflops = roof.sgemm_median_gflops;
  info.sgemm_seconds = roof.sgemm_seconds;
  info.stream_gbytes_per_s = roof.stream_gbytes_per_s;
  info.stream_bytes = roof.stream_bytes;
  info.bandwidth_sweep = roof.bandwidth_sweep;
  info.bandwidth_sweep_seconds = roof.sweep_seconds;
  info.cache_roofs = roof.cache_levels;
  info.sysfs_caches = roof.sysfs_caches;
  if (roof.fma_gflops > 0) info.fma_gflops = roof.fma_gflops;
  if (roof.amx_gflops > 0) info.amx_gflops = roof.amx_gflops;
  info.layer_products = product_path_name();
  return info;
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  const Settings s{options.threads > 0 ? options.threads : omp_get_num_procs(), options.keep_chunk_states};
  omp_set_num_threads(s.threads);
  openblas_set_num_threads(1);

  auto backend = std::make_unique<Backend>();
  backend->name = "cpu";
  backend->availability = [] { return Availability{true, ""}; };
  const std::optional<TuningMode> tuning_mode = tuning_mode_from(options.tuning);
  if (!tuning_mode) throw std::invalid_argument("unknown tuning mode " + options.tuning);
  if (!options.amx_tiles.empty()) {
    const std::optional<AmxPath> path = amx_path_from_name(options.amx_tiles);
    if (!path) throw std::invalid_argument("unknown AMX tiles " + options.amx_tiles);
    set_amx_override(*path);
  }
  backend->describe = [threads = s.threads, mode = *tuning_mode] {
    DeviceInfo info;
    info.backend = "cpu";
    info.host = host_info(threads);
    info.cpu = describe_cpu(threads, mode);
    return info;
  };
  backend->impls = {scan_row(), chunked_row(s), window_row(), layer_row("scan", s), layer_row("chunked", s),
                     decode_row(s)};
  for (ImplRow& row : plugin_rows(options.plugins, s.threads)) backend->impls.push_back(std::move(row));
  // Every other row's cold case has its caches evicted before each timed call (cold.hpp).
  for (ImplRow& row : backend->impls) {
    if (row.op == "decode") continue;
    row.prepare = [prepare = row.prepare](const Case& c, const TensorSet& inputs) -> std::unique_ptr<PreparedCase> {
      std::unique_ptr<PreparedCase> inner = prepare(c, inputs);
      if (!cache_cold(c)) return inner;
      return std::make_unique<EvictingCase>(std::move(inner));
    };
    row.memory_estimate = [estimate = row.memory_estimate](const Case& c) {
      return (estimate ? estimate(c) : 0) + (cache_cold(c) ? eviction_bytes() : 0);
    };
  }
  backend->memory_is_host = true;
  backend->memory_available = [] { return available_host_memory(); };
  // Best of ten products: ~25 ms with the warm-up, twice per case.
  backend->peak_check = [threads = s.threads]() -> std::optional<double> { return cpu_sgemm_check(threads, 10); };
  backend->stream_check = [threads = s.threads]() -> std::optional<double> { return cpu_stream_check(threads); };
  // The bf16 variants on AMX tiles: the AMX rows of the chunked table and the layer's products.
  backend->amx_tiles = [](const Case& c, const std::string& variant) -> std::string {
    if (!is_bf16(c) || (variant.rfind("chunked_amx", 0) != 0 && variant.rfind("products amx", 0) != 0)) return "";
    return amx_path_name(amx_path());
  };
  backend->count_tiles = [](PreparedCase& prepared) {
    amx::counted::reset();
    prepared.run();
    const amx::TileCounts t = amx::counted::totals();
    return std::map<std::string, std::uint64_t>{{"tdpbf16ps", t.dpbf16ps},       {"tileloadd", t.loads},
                                                {"tileloadd_bytes", t.load_bytes}, {"tilestored", t.stores},
                                                {"tilestored_bytes", t.store_bytes}, {"tilezero", t.zeros}};
  };
  return backend;
}

}  // namespace lattn::cpu
