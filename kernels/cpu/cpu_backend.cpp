#include "cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdlib>

#include "build_info.hpp"
#include "roofline.hpp"
#include "counting_allocator.hpp"
#include "cpu/kernels.hpp"
#include "cpu/scan_pass.hpp"

namespace lattn::cpu {
namespace {

std::size_t bytes_of(const std::vector<float>& v) { return v.size() * sizeof(float); }

class CpuCase final : public PreparedCase {
 public:
  CpuCase(const Case& kase, const KernelTensors& inputs) : kase_(kase), t_(inputs) {
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

  void run() override {
    const std::size_t live_before = allocator_.live_bytes();
    allocator_.reset_peak();
    const Problem& p = kase_.problem;
    const ForwardArgs<float> fwd{t_.q.data(), t_.k.data(), t_.v.data(), t_.h0.data(), t_.o.data(), t_.hT.data()};
    if (kase_.impl == Impl::scan)
      scan_forward(p, fwd, allocator_);
    else
      chunked_forward(p, fwd, allocator_);
    if (kase_.mode == Mode::fwd_bwd) {
      const BackwardArgs<float> bwd{t_.q.data(),  t_.k.data(),  t_.v.data(),  t_.h0.data(),
                                    t_.dO.data(), t_.dhT.data(), t_.dq.data(), t_.dk.data(),
                                    t_.dv.data(), t_.dh0.data()};
      if (kase_.impl == Impl::scan)
        scan_backward(p, bwd, allocator_);
      else
        chunked_backward(p, bwd, allocator_);
    }
    const std::size_t peak = allocator_.peak_bytes() - live_before;
    if (peak > temp_peak_) temp_peak_ = peak;
  }

  double time_ms(int calls) override {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) run();
    const auto stop = std::chrono::steady_clock::now();
    return std::chrono::duration<double, std::milli>(stop - start).count();
  }

  MemoryUsage memory() const override {
    MemoryUsage m;
    m.arg_bytes = bytes_of(t_.q) + bytes_of(t_.k) + bytes_of(t_.v) + bytes_of(t_.h0) + bytes_of(t_.dO) + bytes_of(t_.dhT);
    m.out_bytes = bytes_of(t_.o) + bytes_of(t_.hT) + bytes_of(t_.dq) + bytes_of(t_.dk) + bytes_of(t_.dv) + bytes_of(t_.dh0);
    m.temp_bytes = temp_peak_;
    return m;
  }

  void read_outputs(KernelTensors& out) override {
    out.o = t_.o;
    out.hT = t_.hT;
    out.dq = t_.dq;
    out.dk = t_.dk;
    out.dv = t_.dv;
    out.dh0 = t_.dh0;
  }

 private:
  Case kase_;
  KernelTensors t_;
  CountingAllocator allocator_;
  std::size_t temp_peak_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options)
      : threads_(options.threads > 0 ? options.threads : omp_get_num_procs()) {
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
    info["stream_gbytes_per_s"] = roof.stream_gbytes_per_s;
    info["stream_bytes"] = roof.stream_bytes;
    info["peak_gflops"] = roof.sgemm_gflops;
    return info;
  }

  std::unique_ptr<PreparedCase> prepare(const Case& kase, const KernelTensors& inputs) override {
    return std::make_unique<CpuCase>(kase, inputs);
  }

 private:
  int threads_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const BackendOptions& options) {
  return std::make_unique<CpuBackend>(options);
}

}  // namespace lattn::cpu
