#include "cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <new>
#include <vector>

#include "build_info.hpp"
#include "roofline.hpp"
#include "counting_allocator.hpp"
#include "environment.hpp"
#include "error.hpp"
#include "cpu/kernels.hpp"
#include "cpu/layer_kernels.hpp"
#include "cpu/scan_pass.hpp"

namespace lattn::cpu {
namespace {

// The case's own copies of its tensors start on 64-byte lines, as a framework's tensors do (a
// std::vector's large buffer starts 16 bytes into its mapping): a kernel may then stream whole
// output lines past the cache, and timings do not hinge on where malloc put the data.
template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) {
    const std::size_t bytes = (n * sizeof(T) + 63) / 64 * 64;
    if (void* p = std::aligned_alloc(64, bytes == 0 ? 64 : bytes)) return static_cast<T*>(p);
    throw std::bad_alloc();
  }
  void deallocate(T* p, std::size_t) noexcept { std::free(p); }
  friend bool operator==(const LineAligned&, const LineAligned&) { return true; }
};
using Floats = std::vector<float, LineAligned<float>>;

Floats copy_of(const std::vector<float>& v) { return Floats(v.begin(), v.end()); }
std::vector<float> plain(const Floats& v) { return std::vector<float>(v.begin(), v.end()); }

template <class V>
std::size_t bytes_of(const V& v) {
  return v.size() * sizeof(float);
}

template <class V, class... Rest>
std::size_t bytes_of(const V& first, const Rest&... rest) {
  return bytes_of(first) + bytes_of(rest...);
}

struct HostKernelTensors {
  Floats q, k, v, h0, dO, dhT, o, hT, dq, dk, dv, dh0;
  explicit HostKernelTensors(const KernelTensors& in)
      : q(copy_of(in.q)), k(copy_of(in.k)), v(copy_of(in.v)), h0(copy_of(in.h0)), dO(copy_of(in.dO)),
        dhT(copy_of(in.dhT)) {}
};

struct HostLayerTensors {
  Floats x, wq, wk, wv, wo, g, beta, dOut, out, dx, dwq, dwk, dwv, dwo, dg, dbeta;
  explicit HostLayerTensors(const LayerTensors& in)
      : x(copy_of(in.x)), wq(copy_of(in.wq)), wk(copy_of(in.wk)), wv(copy_of(in.wv)), wo(copy_of(in.wo)),
        g(copy_of(in.g)), beta(copy_of(in.beta)), dOut(copy_of(in.dOut)) {}
};

// Runs `call` on `allocator` and keeps the largest scratch peak seen over the calls.
template <class Call>
void counted(CountingAllocator& allocator, std::size_t& temp_peak, Call&& call) {
  const std::size_t live_before = allocator.live_bytes();
  allocator.reset_peak();
  call();
  temp_peak = std::max(temp_peak, allocator.peak_bytes() - live_before);
}

template <class Case>
double time_calls(Case& kase, int calls) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) kase.run();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::milli>(stop - start).count();
}

class CpuCase final : public PreparedCase {
 public:
  CpuCase(const Case& kase, const KernelTensors& inputs, bool keep_chunk_states)
      : kase_(kase), t_(inputs), keep_chunk_states_(keep_chunk_states) {
    const Problem& p = kase.problem;
    t_.o.assign(p.token_elems(), 0.0f);
    t_.hT.assign(p.state_elems(), 0.0f);
    if (kase.mode == Mode::fwd_bwd) {
      t_.dq.assign(p.token_elems(), 0.0f);
      t_.dk.assign(p.token_elems(), 0.0f);
      t_.dv.assign(p.token_elems(), 0.0f);
      t_.dh0.assign(p.state_elems(), 0.0f);
    }
  }

  void run() override { counted(allocator_, temp_peak_, [&] { call(); }); }

  double time_ms(int calls) override { return time_calls(*this, calls); }

  MemoryUsage memory() const override {
    MemoryUsage m;
    m.arg_bytes = bytes_of(t_.q, t_.k, t_.v, t_.h0, t_.dO, t_.dhT);
    m.out_bytes = bytes_of(t_.o, t_.hT, t_.dq, t_.dk, t_.dv, t_.dh0);
    m.temp_bytes = temp_peak_;
    return m;
  }

  std::string bwd_states() const override {
    if (kase_.impl != Impl::chunked || kase_.mode != Mode::fwd_bwd) return {};
    return kept_states_bytes() > 0 ? "kept" : "recomputed";
  }

  void read_outputs(KernelTensors& out) override {
    out.o = plain(t_.o);
    out.hT = plain(t_.hT);
    out.dq = plain(t_.dq);
    out.dk = plain(t_.dk);
    out.dv = plain(t_.dv);
    out.dh0 = plain(t_.dh0);
  }

 private:
  void call() {
    const Problem& p = kase_.problem;
    const bool backward = kase_.mode == Mode::fwd_bwd;
    const ForwardArgs<float> fwd{t_.q.data(), t_.k.data(), t_.v.data(), t_.h0.data(), t_.o.data(), t_.hT.data()};
    const BackwardArgs<float> bwd{t_.q.data(),  t_.k.data(),  t_.v.data(),  t_.h0.data(),
                                  t_.dO.data(), t_.dhT.data(), t_.dq.data(), t_.dk.data(),
                                  t_.dv.data(), t_.dh0.data()};
    // A training step: the whole forward, then the backward from what it saved. dO and dhT stand
    // for gradients that arrive after the forward (SPEC section 1), so no forward reads them.
    if (kase_.impl == Impl::scan) {
      scan_forward(p, fwd, allocator_);
      if (backward) scan_backward(p, bwd, allocator_);
      return;
    }
    // The backward takes the chunk states the forward kept, as a training step would, unless the
    // run asked for them recomputed (less memory).
    Workspace<float> kept(allocator_, backward ? kept_states_bytes() / sizeof(float) : 0);
    chunked_forward(p, fwd, allocator_, kept.data());
    if (backward) chunked_backward(p, bwd, allocator_, kept.data());
  }

  std::size_t kept_states_bytes() const {
    return keep_chunk_states_ ? chunked_kept_states_bytes(kase_.problem) : 0;
  }

  Case kase_;
  HostKernelTensors t_;
  CountingAllocator allocator_;
  std::size_t temp_peak_ = 0;
  bool keep_chunk_states_;
};

class CpuLayerCase final : public PreparedCase {
 public:
  CpuLayerCase(const Case& kase, const LayerTensors& inputs, bool keep_chunk_states) : t_(inputs) {
    problem_ = LayerProblem{kase.problem, kase.window, kase.impl == Impl::chunked, keep_chunk_states};
    backward_ = kase.mode == Mode::fwd_bwd;
    t_.out.assign(problem_.token_elems(), 0.0f);
    if (backward_) {
      t_.dx.assign(problem_.token_elems(), 0.0f);
      for (auto* w : {&t_.dwq, &t_.dwk, &t_.dwv, &t_.dwo}) w->assign(problem_.weight_elems(), 0.0f);
      t_.dg.assign(problem_.model_dim(), 0.0f);
      t_.dbeta.assign(std::size_t(problem_.linear.heads), 0.0f);
    }
  }

  void run() override {
    counted(allocator_, temp_peak_, [&] {
      if (backward_)
        layer_forward_backward(problem_, {t_.x.data(), t_.wq.data(), t_.wk.data(), t_.wv.data(), t_.wo.data(),
                                          t_.g.data(), t_.beta.data(), t_.dOut.data(), t_.out.data(), t_.dx.data(),
                                          t_.dwq.data(), t_.dwk.data(), t_.dwv.data(), t_.dwo.data(), t_.dg.data(),
                                          t_.dbeta.data()},
                               allocator_);
      else
        layer_forward(problem_, {t_.x.data(), t_.wq.data(), t_.wk.data(), t_.wv.data(), t_.wo.data(), t_.g.data(),
                                 t_.beta.data(), t_.out.data()},
                      allocator_);
    });
  }

  double time_ms(int calls) override { return time_calls(*this, calls); }

  MemoryUsage memory() const override {
    MemoryUsage m;
    m.arg_bytes = bytes_of(t_.x, t_.wq, t_.wk, t_.wv, t_.wo, t_.g, t_.beta, t_.dOut);
    m.out_bytes = bytes_of(t_.out, t_.dx, t_.dwq, t_.dwk, t_.dwv, t_.dwo, t_.dg, t_.dbeta);
    m.temp_bytes = temp_peak_;
    return m;
  }

  std::string bwd_states() const override {
    if (!problem_.chunked || !backward_) return {};
    return layer_kept_chunk_states_bytes(problem_) > 0 ? "kept" : "recomputed";
  }

  void read_outputs(KernelTensors&) override { throw RuntimeFailure("read_outputs on a layer case"); }

  void read_layer_outputs(LayerTensors& out) override {
    out.out = plain(t_.out);
    out.dx = plain(t_.dx);
    out.dwq = plain(t_.dwq);
    out.dwk = plain(t_.dwk);
    out.dwv = plain(t_.dwv);
    out.dwo = plain(t_.dwo);
    out.dg = plain(t_.dg);
    out.dbeta = plain(t_.dbeta);
  }

 private:
  LayerProblem problem_;
  bool backward_ = false;
  HostLayerTensors t_;
  CountingAllocator allocator_;
  std::size_t temp_peak_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : threads_(options.threads > 0 ? options.threads : omp_get_num_procs()),
        keep_chunk_states_(options.keep_chunk_states) {
    omp_set_num_threads(threads_);
    openblas_set_num_threads(1);
  }

  std::string name() const override { return "cpu"; }
  Availability availability() const override { return {true, ""}; }

  std::optional<std::string> unsupported_reason(const Case& kase) const override {
    if (kase.dtype != "float32") return "the CPU backend runs float32 only, not " + kase.dtype;
    return std::nullopt;
  }

  nlohmann::json device_info() const override {
    nlohmann::json info = host_info(threads_);
    info["backend"] = "cpu";
    info["blas"] = openblas_get_config();
    info["blas_version"] = OPENBLAS_VERSION;
    info["blas_threads_inside_kernels"] = 1;
    info["blas_core"] = openblas_get_corename();
    if (const char* env = std::getenv("OPENBLAS_CORETYPE")) info["blas_coretype_env"] = env;
    if (const char* detected = std::getenv("LATTN_OPENBLAS_DETECTED")) info["blas_core_detected"] = detected;
    const char* wait_policy = std::getenv("OMP_WAIT_POLICY");
    info["omp_wait_policy"] = wait_policy ? wait_policy : "";
    if (const char* spin = std::getenv("GOMP_SPINCOUNT")) info["gomp_spincount"] = spin;
    if (const char* set = std::getenv("LATTN_ENV_SET")) info["env_set_by_lattnbench"] = set;
    info["scan_vector_width"] = to_string(active_vec());
    // The roofline every record's peak_fraction is taken against, measured once per process.
    const Roofline& roof = cpu_roofline(threads_);
    info["sgemm_gflops"] = roof.sgemm_gflops;
    info["sgemm_n"] = roof.sgemm_n;
    info["sgemm_threads"] = roof.threads;
    info["sgemm_products"] = roof.sgemm_products;
    info["sgemm_median_gflops"] = roof.sgemm_median_gflops;
    info["sgemm_seconds"] = roof.sgemm_seconds;
    info["stream_gbytes_per_s"] = roof.stream_gbytes_per_s;
    info["stream_bytes"] = roof.stream_bytes;
    if (roof.fma_gflops > 0) info["fma_gflops"] = roof.fma_gflops;
    info["peak_gflops"] = roof.sgemm_gflops;
    return info;
  }

  std::unique_ptr<PreparedCase> prepare(const Case& kase, const KernelTensors& inputs) override {
    return std::make_unique<CpuCase>(kase, inputs, keep_chunk_states_);
  }

  std::size_t memory_estimate(const Case& kase) const override {
    const Problem& p = kase.problem;
    const bool backward = kase.mode == Mode::fwd_bwd;
    if (kase.is_layer()) {
      const LayerProblem layer{p, kase.window, kase.impl == Impl::chunked, keep_chunk_states_};
      const std::size_t M = std::size_t(kase.model_dim());
      const std::size_t tensors = (backward ? 4 : 2) * p.token_elems() + (backward ? 8 : 4) * M * M;
      return tensors * sizeof(float) +
             (backward ? layer_forward_backward_workspace_bytes(layer) : layer_forward_workspace_bytes(layer));
    }
    const std::size_t tensors = (backward ? 4 : 3) * p.token_elems() + (backward ? 2 : 1) * p.state_elems();
    const std::size_t outputs = (backward ? 4 : 1) * p.token_elems() + (backward ? 2 : 1) * p.state_elems();
    std::size_t scratch = kase.impl == Impl::scan ? scan_forward_workspace_bytes(p) : chunked_forward_workspace_bytes(p);
    if (backward)
      scratch = kase.impl == Impl::scan      ? std::max(scratch, scan_backward_workspace_bytes(p))
                : keep_chunk_states_ ? chunked_forward_backward_workspace_bytes(p)
                                     : std::max(scratch, chunked_backward_workspace_bytes(p));
    return (tensors + outputs) * sizeof(float) + scratch;
  }

  std::size_t memory_available() const override { return available_host_memory(); }
  bool memory_is_host() const override { return true; }

  // Best of ten products: ~25 ms with the warm-up, twice per case.
  std::optional<double> peak_check_gflops() override { return cpu_sgemm_check(threads_, 10); }

  bool runs_layer_suite() const override { return true; }

  std::unique_ptr<PreparedCase> prepare_layer(const Case& kase, const LayerTensors& inputs) override {
    return std::make_unique<CpuLayerCase>(kase, inputs, keep_chunk_states_);
  }

 private:
  int threads_;
  bool keep_chunk_states_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace lattn::cpu
