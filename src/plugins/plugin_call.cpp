#include "src/plugins/plugin_call.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <new>

#include "core/error.hpp"
#include "core/op.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/linear_attention/problem.hpp"

namespace lattn {
namespace {

// The backend's counting allocator behind a lattn_allocator. It keeps each live block's size, so
// that a plugin that frees with a wrong size cannot skew temp_mb, and blocks still live when the
// call returns are found (and given back) instead of growing the count call after call. The
// backend's raw memory is at least 256-byte aligned (the interface's promise).
class Scratch {
 public:
  explicit Scratch(Allocator& backing) : backing_(backing) {
    c_.ctx = this;
    c_.allocate = [](void* ctx, size_t bytes) { return static_cast<Scratch*>(ctx)->allocate(bytes); };
    c_.deallocate = [](void* ctx, void* ptr, size_t) { static_cast<Scratch*>(ctx)->deallocate(ptr); };
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  ~Scratch() { release_all(); }

  const lattn_allocator* get() const { return &c_; }

  // Gives back every block still live; their total bytes.
  std::size_t release_all() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::size_t total = 0;
    for (const auto& [ptr, bytes] : live_) {
      backing_.deallocate(ptr, bytes);
      total += bytes;
    }
    live_.clear();
    return total;
  }

 private:
  void* allocate(std::size_t bytes) noexcept {
    if (bytes == 0) return nullptr;
    try {
      void* ptr = backing_.allocate(bytes);
      std::lock_guard<std::mutex> lock(mutex_);
      live_[ptr] = bytes;
      return ptr;
    } catch (...) {
      return nullptr;  // the interface's failure: never an exception through C code
    }
  }

  void deallocate(void* ptr) noexcept {
    if (!ptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours, or freed twice: ignored rather than corrupting the pool
    backing_.deallocate(ptr, it->second);
    live_.erase(it);
  }

  Allocator& backing_;
  lattn_allocator c_{};
  std::mutex mutex_;
  std::map<void*, std::size_t> live_;
};

std::string message(const char* err, int status) {
  const std::string text(err, strnlen(err, 1024));
  return text.empty() ? "returned " + std::to_string(status) + " (no message)" : text;
}

// A version 2 C plugin's impl: its lattn_impl2's functions, called as they are.
class CImplFunctions final : public ImplFunctions {
 public:
  explicit CImplFunctions(const lattn_impl2* impl) : impl_(impl) {}
  bool has_backward() const override { return impl_->backward != nullptr; }
  std::optional<std::string> unsupported(const lattn_case2& c) const override {
    if (!impl_->unsupported) return std::nullopt;
    if (const char* why = impl_->unsupported(&c)) return std::string(why);
    return std::nullopt;
  }
  int forward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream, void** saved,
              char* err, size_t errlen) const override {
    return impl_->forward(&c, &t, alloc, stream, saved, err, errlen);
  }
  int backward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream, void* saved,
               char* err, size_t errlen) const override {
    return impl_->backward(&c, &t, alloc, stream, saved, err, errlen);
  }

 private:
  const lattn_impl2* impl_;
};

// Version 1's case and tensors: the first fields of version 2's, copied field by field.
lattn_case case_v1(const lattn_case2& c) {
  lattn_case v1{};
  v1.op = c.op, v1.mode = c.mode, v1.decay = c.decay, v1.rule = c.rule, v1.dtype = c.dtype, v1.device = c.device;
  v1.batch = c.batch, v1.heads = c.heads, v1.seq = c.seq, v1.dim = c.dim, v1.chunk = c.chunk;
  v1.scale = c.scale;
  v1.threads = c.threads;
  return v1;
}

lattn_tensors tensors_v1(const lattn_tensors2& t) {
  lattn_tensors v1{};
  v1.q = t.q, v1.k = t.k, v1.v = t.v, v1.h0 = t.h0, v1.g = t.g, v1.beta = t.beta, v1.gamma = t.gamma;
  v1.o = t.o, v1.hT = t.hT, v1.dO = t.dO, v1.dhT = t.dhT;
  v1.dq = t.dq, v1.dk = t.dk, v1.dv = t.dv, v1.dh0 = t.dh0, v1.dg = t.dg, v1.dbeta = t.dbeta;
  return v1;
}

// A version 1 C plugin's impl: its lattn_impl's functions, on version 1's case and tensors.
class CImplFunctionsV1 final : public ImplFunctions {
 public:
  explicit CImplFunctionsV1(const lattn_impl* impl) : impl_(impl) {}
  int version() const override { return 1; }
  bool has_backward() const override { return impl_->backward != nullptr; }
  std::optional<std::string> unsupported(const lattn_case2& c) const override {
    if (!impl_->unsupported) return std::nullopt;
    const lattn_case v1 = case_v1(c);
    if (const char* why = impl_->unsupported(&v1)) return std::string(why);
    return std::nullopt;
  }
  int forward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream, void** saved,
              char* err, size_t errlen) const override {
    const lattn_case v1 = case_v1(c);
    const lattn_tensors t1 = tensors_v1(t);
    return impl_->forward(&v1, &t1, alloc, stream, saved, err, errlen);
  }
  int backward(const lattn_case2& c, const lattn_tensors2& t, const lattn_allocator* alloc, void* stream, void* saved,
               char* err, size_t errlen) const override {
    const lattn_case v1 = case_v1(c);
    const lattn_tensors t1 = tensors_v1(t);
    return impl_->backward(&v1, &t1, alloc, stream, saved, err, errlen);
  }

 private:
  const lattn_impl* impl_;
};

}  // namespace

// Here rather than in plugins.cpp: the CUDA emulation tests call C plugins through this file alone.
std::shared_ptr<const ImplFunctions> c_impl_functions(const lattn_impl* impl) {
  return std::make_shared<CImplFunctionsV1>(impl);
}

std::shared_ptr<const ImplFunctions> c_impl_functions(const lattn_impl2* impl) {
  return std::make_shared<CImplFunctions>(impl);
}

std::vector<PluginImplRef> plugin_impls_for(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins,
                                            const std::string& device) {
  std::vector<PluginImplRef> refs;
  for (const auto& plugin : plugins)
    for (const LoadedPlugin::Impl& impl : plugin->impls)
      if (device == impl.device) refs.push_back({plugin, impl.functions, impl.name});
  return refs;
}

PluginCase::PluginCase(const Case& kase, const std::string& device, int threads)
    : op_(kase.op->name), mode_(to_string(kase.mode)), decay_(kase.decay),
      rule_(kase.option("rule").empty() ? "additive" : kase.option("rule")),
      dtype_(kase.dtype == "bf16" ? "bfloat16" : kase.dtype), device_(device) {
  c_.op = op_.c_str();
  c_.mode = mode_.c_str();
  c_.decay = decay_.c_str();
  c_.rule = rule_.c_str();
  c_.dtype = dtype_.c_str();
  c_.device = device_.c_str();
  c_.batch = kase.batch;
  c_.heads = kase.heads;
  c_.seq = kase.seq;
  c_.dim = kase.dim;
  c_.chunk = kase.chunk;
  const Problem p = linear_problem(kase);
  c_.scale = output_scale(p);  // dim^-1/2; 1 for the trapezoidal rule
  c_.threads = device == "cpu" ? threads : 0;
  c_.householder = p.householder;
  c_.bonus = p.bonus ? 1 : 0;
  c_.mimo_rank = p.rank;
}

std::optional<std::string> plugin_unsupported(const PluginImplRef& ref, const Case& kase, const std::string& device,
                                              int threads) {
  if (kase.backward() && !ref.functions->has_backward()) return ref.name + " has no backward (fwd only)";
  const Problem p = linear_problem(kase);
  // The interface's tensors are square and dense ([B][H][T][D], states [B][H][D][D]), in both
  // versions: it has no field for q/k heads, a value dim or document offsets.
  if (!p.square_dense())
    return ref.name + ": the plugin interface takes square dense cases only, not heads_k, dim_v or packed documents";
  if (ref.functions->version() < 2) {
    // Version 1 has no tensors a and b for dplr (docs/spec.md section 1f), no dt or trap for the
    // trapezoidal rule, no bonus u, and one k, v and beta row per token: its impls never see them.
    if (p.dplr()) return ref.name + ": the plugin interface (version 1) has no tensors a and b for rule dplr";
    if (p.trapezoidal())
      return ref.name + ": the plugin interface (version 1) has no dt or trap tensor for rule trapezoidal";
    if (p.bonus) return ref.name + ": the plugin interface (version 1) has no bonus tensor u";
    if (p.householder > 1)
      return ref.name + ": the plugin interface (version 1) takes one key, value and beta row per token (householder 1)";
  }
  const PluginCase c(kase, device, threads);
  if (auto why = ref.functions->unsupported(c.get())) return ref.name + ": " + *why;
  return std::nullopt;
}

lattn_tensors2 plugin_tensors(const Case& kase, const std::function<void*(const std::string&)>& data, const float* gamma) {
  const LinearTensors b = bind_linear_tensors(kase, data);
  lattn_tensors2 t{};
  t.q = b.q, t.k = b.k, t.v = b.v, t.h0 = b.h0, t.g = b.g, t.beta = b.beta, t.gamma = gamma;
  t.o = b.o, t.hT = b.hT, t.dO = b.dO, t.dhT = b.dhT;
  t.dq = b.dq, t.dk = b.dk, t.dv = b.dv, t.dh0 = b.dh0, t.dg = b.dg, t.dbeta = b.dbeta;
  t.a = b.a, t.b = b.b, t.u = b.u, t.dt = b.dt, t.trap = b.trap;
  t.da = b.da, t.db = b.db, t.du = b.du, t.ddt = b.ddt, t.dtrap = b.dtrap;
  return t;
}

std::vector<float> plugin_gamma(const Case& kase) {
  if (kase.decay != "retnet") return {};
  std::vector<float> gamma(std::size_t(kase.heads));
  for (int h = 0; h < kase.heads; ++h) gamma[std::size_t(h)] = float(decay_gamma(Decay::retnet, h));
  return gamma;
}

void call_plugin(const PluginImplRef& ref, const lattn_case2& c, const lattn_tensors2& tensors, Allocator& allocator,
                 void* stream) {
  Scratch scratch(allocator);
  char err[1024] = "";
  // The forward sees no cotangent and writes no gradient (docs/spec.md section 1: they arrive later).
  lattn_tensors2 forward = tensors;
  forward.dO = nullptr;
  forward.dhT = nullptr;
  forward.dq = forward.dk = forward.dv = nullptr;
  forward.dh0 = forward.dg = forward.dbeta = nullptr;
  forward.da = forward.db = forward.du = forward.ddt = forward.dtrap = nullptr;
  void* saved = nullptr;
  if (const int status = ref.functions->forward(c, forward, scratch.get(), stream, &saved, err, sizeof err); status != 0) {
    err[sizeof err - 1] = '\0';
    throw RuntimeFailure(ref.name + " forward failed: " + message(err, status));
  }
  if (std::strcmp(c.mode, "fwd_bwd") == 0) {
    if (const int status = ref.functions->backward(c, tensors, scratch.get(), stream, saved, err, sizeof err); status != 0) {
      err[sizeof err - 1] = '\0';
      throw RuntimeFailure(ref.name + " backward failed: " + message(err, status));
    }
  }
  if (const std::size_t left = scratch.release_all(); left > 0)
    throw RuntimeFailure(ref.name + " left " + std::to_string(left) +
                         " bytes of scratch allocated after the call (the backward releases what the forward "
                         "saved; a fwd case's forward keeps nothing)");
}

}  // namespace lattn
