// The CUDA backend's table: one row per (op, form) it runs, each binding the case's device buffers
// to the CUDA kernels of kernels/<op>/ (cuda.cu, or cuda/) once (device_case.hpp), and the device block. Host code
// only, built by the host compiler.
#include "backends/cuda/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "backends/cuda/cublas.hpp"
#include "backends/cuda/device_case.hpp"
#include "backends/cuda/plugin_rows.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "kernels/cuda/check.hpp"
#include "kernels/decode/cuda.hpp"
#include "kernels/decode/op.hpp"
#include "kernels/layer/hybrid/cuda/kernels.hpp"
#include "kernels/layer/hybrid/op.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/cuda.hpp"
#include "src/results/build_info.hpp"
#include "src/run/in_place_case.hpp"

namespace lattn::cuda {
namespace {

struct Settings {
  int threads = 0;
  int device = 0;
  bool keep_chunk_states = true;
};

std::string version_string(int v) { return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10); }

Dtype dtype_of(const std::string& name) { return name == "bf16" ? Dtype::bf16 : Dtype::f32; }

std::string first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The dtype check every row shares, then the device's opt-in shared memory for the row's own
// limits; nothing when the row can run the case.
std::optional<std::string> dtype_unsupported(const Case& c, bool float32_only) {
  if (c.dtype != "float32" && c.dtype != "bf16") return "the CUDA backend runs float32 and bf16, not " + c.dtype;
  if (float32_only && c.dtype != "float32") return "the CUDA " + c.op->name + " runs float32 only";
  return std::nullopt;
}

std::optional<std::size_t> shared_memory(int device) {
  int shared = 0;
  if (cudaDeviceGetAttribute(&shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
    cudaGetLastError();
    return std::nullopt;
  }
  return std::size_t(shared);
}

std::string no_shared_memory(int device) {
  return "no CUDA device: cannot read device " + std::to_string(device) + "'s shared memory size";
}

// The backend's copies of the tensors (bf16 inputs counted at 4 bytes: the estimate errs high),
// the scratch, and a cold case's flush buffer.
std::size_t tensor_bytes(const Case& c) { return (case_input_elems(c) + case_output_elems(c)) * sizeof(float); }

SwaProblem window_problem(const Case& c) { return {c.batch, c.heads, c.seq, c.dim, c.window}; }

// ---- linear attention (kernels/linear_attention/cuda/): the chunked form's chunk states are
// scratch (kernels/linear_attention/cuda/kernels.hpp) ----

// The form's variant table (kernels/linear_attention/cuda/variants.cpp) decides which kernel runs a
// case and declines one it has no variant for. A fwd_bwd whose variant can keep the forward's
// chunk states holds them across both calls (counted with the backward's own scratch) unless the
// run asked for them recomputed.
bool keeps_states(const Case& c, const CudaVariant& v, const Settings& s) {
  return v.kept_states_bytes && c.backward() && s.keep_chunk_states;
}

std::size_t linear_scratch_bytes(const Case& c, const std::string& form, const Settings& s) {
  const Problem p = linear_problem(c);
  const Dtype dtype = dtype_of(c.dtype);
  const CudaVariant& v = cuda_variant_for(form, p);
  if (!c.backward()) return v.forward_workspace_bytes(p, dtype);
  return keeps_states(c, v, s) ? v.kept_states_bytes(p, dtype) + v.backward_workspace_bytes(p, dtype, true)
                               : std::max(v.forward_workspace_bytes(p, dtype), v.backward_workspace_bytes(p, dtype, false));
}

ImplRow linear_row(const std::string& form, const Settings& s) {
  const bool chunked = form == "chunked";
  ImplRow row{"linear_attention", form, nullptr, nullptr, nullptr};
  row.unsupported = [s, form](const Case& c) -> std::optional<std::string> {
    if (auto why = dtype_unsupported(c, false)) return why;
    const auto shared = shared_memory(s.device);
    if (!shared) return no_shared_memory(s.device);
    const Problem p = linear_problem(c);
    std::string why;
    const CudaVariant* v = cuda_variant(form, p, &why);
    if (!v) return why;
    return v->device_limits ? v->device_limits(p, dtype_of(c.dtype), *shared) : std::nullopt;
  };
  row.variant = [form](const Case& c) { return cuda_variant_for(form, linear_problem(c)).name; };
  row.prepare = [s, form, chunked](const Case& c, const TensorSet& inputs) {
    auto d = std::make_unique<DeviceCase>(c, inputs, s.device);
    const Problem p = linear_problem(c);
    const Dtype dtype = dtype_of(c.dtype);
    const CudaVariant& v = cuda_variant_for(form, p);
    DeviceCase* owner = d.get();
    const LinearTensors tensors =
        bind_linear_tensors(c, [owner](const std::string& name) -> void* { return owner->data(name); });
    const DeviceForward fwd = device_forward_args(tensors);
    const DeviceBackward bwd = device_backward_args(tensors);
    DeviceCase* self = d.get();
    const bool backward = c.backward(), keep = keeps_states(c, v, s);
    const std::size_t kept_bytes = keep ? v.kept_states_bytes(p, dtype) : 0;
    d->bind(
        [self, p, dtype, fwd, bwd, backward, kept_bytes, forward = v.forward, backward_call = v.backward] {
          Allocator& a = self->allocator();
          Workspace<unsigned char> kept(a, kept_bytes);
          forward(p, dtype, fwd, a, self->stream(), kept.data());
          if (backward) backward_call(p, dtype, bwd, a, self->stream(), kept.data());
        },
        chunked && backward ? (keep ? "kept" : "recomputed") : "");
    return std::unique_ptr<PreparedCase>(std::move(d));
  };
  row.memory_estimate = [s, form](const Case& c) {
    return tensor_bytes(c) + linear_scratch_bytes(c, form, s) + flush_bytes(s.device, c);
  };
  return row;
}

// ---- sliding-window attention (kernels/sliding_window/cuda.cu) ----

ImplRow window_row(const Settings& s) {
  ImplRow row{"sliding_window", "blocked", nullptr, nullptr, nullptr};
  row.unsupported = [s](const Case& c) -> std::optional<std::string> {
    if (auto why = dtype_unsupported(c, false)) return why;
    const auto shared = shared_memory(s.device);
    if (!shared) return no_shared_memory(s.device);
    return swa_unsupported(window_problem(c), dtype_of(c.dtype), *shared);
  };
  row.prepare = [s](const Case& c, const TensorSet& inputs) {
    auto d = std::make_unique<DeviceCase>(c, inputs, s.device);
    const SwaProblem w = window_problem(c);
    const Dtype dtype = dtype_of(c.dtype);
    const bool backward = c.backward();
    // The forward's per-row log-sum-exp, which the backward reads: scratch of the call.
    DeviceCase* self = d.get();
    void* q = d->data("q");
    void* k = d->data("k");
    void* v = d->data("v");
    float* o = d->floats("o");
    void* dO = backward ? d->data("dO") : nullptr;
    float* dq = backward ? d->floats("dq") : nullptr;
    float* dk = backward ? d->floats("dk") : nullptr;
    float* dv = backward ? d->floats("dv") : nullptr;
    d->bind([self, w, dtype, backward, q, k, v, o, dO, dq, dk, dv] {
      Allocator& a = self->allocator();
      Workspace<float> lse(a, backward ? w.row_elems() : 0);
      swa_forward(w, dtype, {q, k, v, o, lse.data()}, a, self->stream());
      if (backward) swa_backward(w, dtype, {q, k, v, dO, o, lse.data(), dq, dk, dv}, a, self->stream());
    });
    return std::unique_ptr<PreparedCase>(std::move(d));
  };
  row.memory_estimate = [s](const Case& c) {
    const SwaProblem w = window_problem(c);
    const std::size_t scratch =
        c.backward() ? w.row_elems() * sizeof(float) + swa_backward_workspace_bytes(w) : swa_forward_workspace_bytes(w);
    return tensor_bytes(c) + scratch + flush_bytes(s.device, c);
  };
  return row;
}

// ---- the layer (kernels/layer/hybrid/cuda/layer.cpp) ----

std::size_t round_up_256(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

std::size_t layer_scratch_bytes(const LayerProblem& p, bool backward) {
  std::size_t total = 0;
  for (std::size_t bytes : layer_scratch_slices(p, backward)) total += round_up_256(bytes);
  return total;
}

// Scratch handed out from one device block allocated when the case is prepared: a call then never
// calls cudaMalloc or cudaFree (cudaFree waits for the whole device) inside a timed region. Blocks
// come back last-in first-out, as Workspace scopes return them.
class Arena final : public Allocator {
 public:
  explicit Arena(std::size_t capacity) : capacity_(capacity) {
    if (capacity_) LATTN_CUDA_CHECK(cudaMalloc(&base_, capacity_));
  }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  ~Arena() override {
    if (base_) cudaFree(base_);
  }
  void* allocate(std::size_t bytes) override {
    const std::size_t need = round_up_256(bytes);
    if (top_ + need > capacity_)
      throw RuntimeFailure("CUDA layer scratch: a call asked for more than the " + std::to_string(capacity_) +
                           " bytes of its closed form (layer_scratch_slices is out of step with the call)");
    starts_.push_back(top_);
    void* ptr = static_cast<char*>(base_) + top_;
    top_ += need;
    peak_ = std::max(peak_, top_);
    return ptr;
  }
  void deallocate(void* ptr, std::size_t) noexcept override {
    if (!starts_.empty() && ptr == static_cast<char*>(base_) + starts_.back()) {
      top_ = starts_.back();
      starts_.pop_back();
    }
  }
  std::size_t peak() const { return peak_; }

 private:
  void* base_ = nullptr;
  std::size_t capacity_ = 0, top_ = 0, peak_ = 0;
  std::vector<std::size_t> starts_;
};

// What a layer call needs beside its buffers: the arena and the cuBLAS handle on the case's stream.
struct LayerContext {
  Arena arena;
  CublasHandle blas;
  LayerContext(std::size_t scratch, cudaStream_t stream) : arena(scratch), blas(stream) {}
};

ImplRow layer_row(const std::string& form, const Settings& s) {
  ImplRow row{"layer", form, nullptr, nullptr, nullptr};
  row.unsupported = [s](const Case& c) -> std::optional<std::string> {
    if (auto why = dtype_unsupported(c, true)) return why;
    if (layer_problem(c).modern())
      return std::string("the CUDA layer is the hybrid block of docs/spec.md section 2 only: no short convolution, projected "
                         "gates, gated norm, attention none, gated decay or delta rule");
    const auto shared = shared_memory(s.device);
    if (!shared) return no_shared_memory(s.device);
    if (auto why = swa_unsupported(window_problem(c), Dtype::f32, *shared)) return why;
    const Problem p = linear_problem(c);
    if (auto why = c.impl == "chunked" ? chunked_gated_unsupported(p, Dtype::f32, *shared) : scan_unsupported(p)) return why;
    return cublas_unavailable();
  };
  row.prepare = [s](const Case& c, const TensorSet& inputs) {
    auto d = std::make_unique<DeviceCase>(c, inputs, s.device);
    const LayerProblem p = layer_problem(c);
    const bool backward = c.backward();
    auto context = std::make_shared<LayerContext>(layer_scratch_bytes(p, backward), d->stream());
    // A fwd case has no gradients to write.
    auto f = [&](const char* name) { return backward ? d->floats(name) : nullptr; };
    const LayerBackwardArgs<float> args{d->floats("x"), d->floats("wq"), d->floats("wk"), d->floats("wv"),
                                        d->floats("wo"), d->floats("g"),  d->floats("beta"),
                                        backward ? d->floats("dOut") : nullptr, d->floats("out"),
                                        f("dx"), f("dwq"), f("dwk"), f("dwv"), f("dwo"), f("dg"), f("dbeta")};
    const DeviceGemm gemm = context->blas.gemm();
    LayerContext* ctx = context.get();
    cudaStream_t stream = d->stream();
    d->bind([p, backward, args, ctx, gemm, stream] { layer_enqueue(p, backward, args, ctx->arena, gemm, stream); },
            p.chunked && backward ? "recomputed" : "", context, [ctx] { return ctx->arena.peak(); });
    return std::unique_ptr<PreparedCase>(std::move(d));
  };
  row.memory_estimate = [s](const Case& c) {
    return tensor_bytes(c) + layer_scratch_bytes(layer_problem(c), c.backward()) + flush_bytes(s.device, c);
  };
  return row;
}

// ---- the decode step (kernels/decode/cuda.cu): the states are stepped in place in their pool
// (one slot per sequence, or state_slots gathered through state_index; float32 or bf16), re-seeded
// from h0 on the device outside the timed region (src/run/in_place_case.hpp), and gathered into hT
// for the check. A cold case's L2 is flushed before each call (DeviceCase). ----

// The states' pool and the slots as ints, beside the case's tensors.
struct DecodeStates {
  DeviceBuffer pool, index;
};

// A decode case's read_outputs gathers the states from their slots into hT first (inside the
// InPlaceCase, so after its re-seeded step).
class GatheringCase final : public PreparedCase {
 public:
  GatheringCase(std::unique_ptr<PreparedCase> inner, std::function<void()> gather, std::size_t pool_bytes)
      : inner_(std::move(inner)), gather_(std::move(gather)), pool_bytes_(pool_bytes) {}
  void run() override { inner_->run(); }
  double time_ms(int calls) override { return inner_->time_ms(calls); }
  void watch_scratch() override { inner_->watch_scratch(); }
  // hT is where the check's states are gathered to; the pool is what the steps write.
  MemoryUsage memory() const override {
    MemoryUsage m = inner_->memory();
    m.out_bytes += pool_bytes_;
    return m;
  }
  void read_outputs(TensorSet& outputs) override {
    gather_();
    inner_->read_outputs(outputs);
  }

 private:
  std::unique_ptr<PreparedCase> inner_;
  std::function<void()> gather_;
  std::size_t pool_bytes_;
};

ImplRow decode_row(const Settings& s) {
  ImplRow row{"decode", "step", nullptr, nullptr, nullptr};
  row.unsupported = [](const Case& c) -> std::optional<std::string> {
    if (auto why = dtype_unsupported(c, false)) return why;
    if (c.backward()) return "the decode step is forward only";
    return decode_unsupported(decode_problem(c));
  };
  row.prepare = [s](const Case& c, const TensorSet& inputs) {
    auto d = std::make_unique<DeviceCase>(c, inputs, s.device);
    const DecodeProblem p = decode_problem(c);
    const Dtype dtype = dtype_of(c.dtype);
    auto states = std::make_shared<DecodeStates>();
    states->pool = DeviceBuffer(p.pool_elems() * (p.state_bf16 ? 2 : 4));
    DecodeArgs<void> args{d->data("q"),
                          d->data("k"),
                          d->data("v"),
                          p.state_bf16 ? nullptr : static_cast<float*>(states->pool.get()),
                          d->floats("o"),
                          gated(p.decay) ? d->floats("g") : nullptr,
                          p.delta() ? d->floats("beta") : nullptr,
                          p.extra_slots() > 0 ? d->floats("snapshots") : nullptr};
    if (p.state_bf16) args.state_bf16 = static_cast<std::uint16_t*>(states->pool.get());
    if (p.pooled()) {
      const std::vector<float>& slots = inputs.at("state_index").data;
      const std::vector<int> index(slots.begin(), slots.end());
      states->index = DeviceBuffer(index.size() * sizeof(int));
      LATTN_CUDA_CHECK(cudaMemcpy(states->index.get(), index.data(), states->index.bytes(), cudaMemcpyHostToDevice));
      args.state_index = static_cast<const int*>(states->index.get());
    }
    cudaStream_t stream = d->stream();
    d->bind([p, dtype, args, stream] { decode_step(p, dtype, args, stream); }, "", states);
    const float* h0 = d->floats("h0");
    float* hT = d->floats("hT");
    const int device = s.device;
    const std::size_t pool_bytes = states->pool.bytes();
    auto gathering = std::make_unique<GatheringCase>(std::move(d), [p, hT, args, stream, device] {
      LATTN_CUDA_CHECK(cudaSetDevice(device));
      decode_gather_states(p, args, hT, stream);
      LATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
    }, pool_bytes);
    return std::unique_ptr<PreparedCase>(std::make_unique<InPlaceCase>(std::move(gathering), [p, h0, args, stream, device] {
      LATTN_CUDA_CHECK(cudaSetDevice(device));
      decode_seed_states(p, args, h0, stream);
      LATTN_CUDA_CHECK(cudaStreamSynchronize(stream));
    }));
  };
  row.memory_estimate = [s](const Case& c) {
    const DecodeProblem p = decode_problem(c);
    return tensor_bytes(c) + p.pool_elems() * (p.state_bf16 ? 2 : 4) + flush_bytes(s.device, c);
  };
  return row;
}

Availability availability(int device) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear it
    int driver = 0;
    const bool no_driver = cudaDriverGetVersion(&driver) == cudaSuccess && driver == 0;
    return {false, std::string("no CUDA device: ") + (no_driver ? "no NVIDIA driver is loaded here (" : "") +
                       cudaGetErrorString(status) + (no_driver ? ")" : "")};
  }
  if (count == 0) return {false, "no CUDA device: no device"};
  if (device >= count)
    return {false, "no CUDA device: --device " + std::to_string(device) + " asked for, but this machine has " +
                       std::to_string(count) + " (0.." + std::to_string(count - 1) + ")"};
  return {true, ""};
}

CudaDeviceInfo describe_cuda(const Settings& s) {
  CudaDeviceInfo info;
  info.cuda_targets = LATTN_CUDA_TARGETS;
  info.nvcc = LATTN_NVCC_VERSION;
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) info.cuda_runtime = version_string(runtime);
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) info.driver_cuda_version = version_string(driver);
  if (const std::string release = first_line("/proc/driver/nvidia/version"); !release.empty()) info.driver = release;
  const Availability a = availability(s.device);
  if (!a.available) {
    info.unavailable = a.reason;
    return info;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, s.device) != cudaSuccess) {
    cudaGetLastError();
    return info;
  }
  GpuInfo gpu;
  gpu.device_index = s.device;
  gpu.name = prop.name;
  gpu.compute_capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  gpu.sm_count = prop.multiProcessorCount;
  gpu.memory_gb = double(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0);
  gpu.l2_cache_mb = double(prop.l2CacheSize) / (1024.0 * 1024.0);
  gpu.shared_memory_per_block_optin_kb = double(prop.sharedMemPerBlockOptin) / 1024.0;
  gpu.memory_bus_width_bits = prop.memoryBusWidth;
  auto attribute_mhz = [&](cudaDeviceAttr attr) -> std::optional<double> {
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, attr, s.device) == cudaSuccess && khz > 0) return double(khz) / 1000.0;
    cudaGetLastError();
    return std::nullopt;
  };
  gpu.sm_clock_mhz = attribute_mhz(cudaDevAttrClockRate);
  gpu.memory_clock_mhz = attribute_mhz(cudaDevAttrMemoryClockRate);
  info.gpu = gpu;
  return info;
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  const Settings s{options.threads, options.device, options.keep_chunk_states};
  auto backend = std::make_unique<Backend>();
  backend->name = "cuda";
  backend->availability = [device = s.device] { return availability(device); };
  backend->describe = [s] {
    DeviceInfo info;
    info.backend = "cuda";
    info.host = host_info(s.threads);
    info.cuda = describe_cuda(s);
    return info;
  };
  backend->impls = {linear_row("scan", s), linear_row("chunked", s), window_row(s), layer_row("scan", s),
                    layer_row("chunked", s), decode_row(s)};
  for (ImplRow& row : plugin_rows(options.plugins, s.device)) backend->impls.push_back(std::move(row));
  backend->memory_available = [device = s.device]() -> std::size_t {
    std::size_t free = 0, total = 0;
    if (cudaSetDevice(device) != cudaSuccess || cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return std::size_t(-1);  // cannot tell: let the allocation itself decide
    }
    return free;
  };
  return backend;
}

}  // namespace lattn::cuda
