// The one interface every backend (CPU, CUDA) implements. A backend answers whether it is usable
// here and whether it supports a case before anything runs, so an unsupported case is a skip with
// a reason, never a failure mid-run.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config.hpp"

namespace lattn {

struct Availability {
  bool available = false;
  std::string reason;  // why not, when not
};

// Host-side float32 tensors of one kernel case (layouts in kernels/problem.hpp). Backward-only
// tensors are empty for mode fwd.
struct KernelTensors {
  std::vector<float> q, k, v, h0, dO, dhT;      // inputs
  std::vector<float> o, hT, dq, dk, dv, dh0;    // outputs
};

// Host-side float32 tensors of one layer case (SPEC section 2; M = heads * head_dim, row-major):
//   x, dOut, out, dx : [batch][seq][M]     wq, wk, wv, wo and their gradients : [M][M] (y = x W)
//   g, dg : [M]                            beta, dbeta : [heads]
// dOut and the gradients are empty for mode fwd.
struct LayerTensors {
  std::vector<float> x, wq, wk, wv, wo, g, beta, dOut;               // inputs
  std::vector<float> out, dx, dwq, dwk, dwv, dwo, dg, dbeta;         // outputs
};

struct MemoryUsage {
  std::size_t arg_bytes = 0;
  std::size_t out_bytes = 0;
  std::size_t temp_bytes = 0;  // peak scratch of one call beyond inputs and outputs
};

// A case with its inputs resident on the device and its outputs allocated.
class PreparedCase {
 public:
  virtual ~PreparedCase() = default;
  // One call: the forward, or the forward then the backward for fwd_bwd. Synchronous.
  virtual void run() = 0;
  // Milliseconds of `calls` back-to-back calls, by the backend's own clock, synchronised at the end.
  virtual double time_ms(int calls) = 0;
  // Peak scratch seen over the calls so far, and the input/output sizes.
  virtual MemoryUsage memory() const = 0;
  // Copies the outputs of the last call to the host (outside any timed region).
  virtual void read_outputs(KernelTensors& tensors) = 0;
  // The same for a case made by Backend::prepare_layer.
  virtual void read_layer_outputs(LayerTensors& tensors);
  // How a chunked fwd_bwd's backward got the state entering each chunk: "kept" from the forward,
  // or "recomputed"; empty for other cases.
  virtual std::string bwd_states() const { return {}; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Availability availability() const = 0;
  // Why this backend cannot run `kase`, or nothing when it can.
  virtual std::optional<std::string> unsupported_reason(const Case& kase) const = 0;
  // The `device` block of the result file (docs/results.md).
  virtual nlohmann::json device_info() const = 0;
  virtual std::unique_ptr<PreparedCase> prepare(const Case& kase, const KernelTensors& inputs) = 0;

  // For the memory guard: bytes this backend will hold for `kase` (its copies of the inputs and
  // outputs, and the kernel's scratch), and the bytes free where it holds them. The defaults
  // make the guard a no-op for a backend that cannot tell.
  virtual std::size_t memory_estimate(const Case& /*kase*/) const { return 0; }
  virtual std::size_t memory_available() const { return std::size_t(-1); }
  // True when the backend's memory is host RAM (the CPU backend), so that the run's own host
  // buffers and the backend's draw on the same pool.
  virtual bool memory_is_host() const { return false; }

  // A quick re-measurement of the device block's peak (GFLOP/s), taken by the runner just before
  // and just after each case, or nothing where the backend has none (docs/results.md,
  // peak_gflops_now).
  virtual std::optional<double> peak_check_gflops() { return std::nullopt; }

  // The layer suite (kase.suite == "layer"). A backend without it keeps these defaults: the runner
  // then skips its layer cases with a reason instead of failing them.
  virtual bool runs_layer_suite() const { return false; }
  virtual std::unique_ptr<PreparedCase> prepare_layer(const Case& kase, const LayerTensors& inputs);
};

struct BackendOptions {
  int threads = 0;    // CPU threads for the whole run; 0: every core
  int device = 0;     // GPU index (CUDA backend)
  bool cold = false;  // flush the L2 cache before each timed call (CUDA backend)
  // Chunked fwd_bwd: the forward keeps the chunk states for the backward where the backend can
  // (CPU tiled path), else the backward recomputes them. Records say which (`bwd_states`).
  bool keep_chunk_states = true;
};

// Every backend this build knows, available here or not ("cpu" always; "cuda" when built).
std::vector<std::string> backend_names();
// Throws UsageError when `name` is unknown or not built in this binary.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options);

}  // namespace lattn
