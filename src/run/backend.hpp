// A backend is a small capability table, as ggml's are: its name, whether it is usable here, a
// typed description of its device, and a list of impl rows, one per (op, form) it runs. The runner
// asks a row whether it can run a case and has it prepare the case; it never asks what kind of op
// a case is. A case no row supports is a skip with the reason, never a failure mid-run.
// Rows are written in backends/<name>/; src/run/backends.cpp is the one file that knows them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/tensor_set.hpp"
#include "src/results/device_info.hpp"

namespace lattn {

struct LoadedPlugin;

struct Availability {
  bool available = false;
  std::string reason;  // why not, when not
};

struct MemoryUsage {
  std::size_t arg_bytes = 0;
  std::size_t out_bytes = 0;
  std::size_t temp_bytes = 0;  // peak scratch of one call beyond inputs and outputs
  std::string temp_uncounted;  // why temp_bytes is not the call's scratch (a Python impl's); empty when it is
  // What counted temp_bytes (the record's temp_mb_source): lattnbench's counting allocator, or a
  // Python impl's library (tracemalloc, torch.cuda, jax.memory_stats).
  std::string temp_source = "counting_allocator";
  // An impl handed its tensors in another layout (src/run/plugin_layout.hpp): its name, and the
  // bytes converted outside the timed calls; empty and 0 otherwise.
  std::string layout;
  std::size_t layout_copy_bytes = 0;
};

// A case with its inputs resident on the device and its outputs allocated.
class PreparedCase {
 public:
  virtual ~PreparedCase() = default;
  // One call: the forward, or the forward then the backward for fwd_bwd. Synchronous.
  virtual void run() = 0;
  // Milliseconds of `calls` back-to-back calls, by the backend's own clock, synchronised at the end.
  virtual double time_ms(int calls) = 0;
  // One more call, outside any timed region, with the impl's own allocator watched, for a row whose
  // scratch the counting allocator does not see (a Python impl's; docs/plugins.md); nothing for
  // the others. Its outputs are the same as any call's.
  virtual void watch_scratch() {}
  // Peak scratch seen over the calls so far, and the input/output sizes.
  virtual MemoryUsage memory() const = 0;
  // Copies the outputs of the last call into `outputs` (outside any timed region); `outputs` holds
  // the case's output tensors (make_case_outputs).
  virtual void read_outputs(TensorSet& outputs) = 0;
  // How a chunked fwd_bwd's backward got the state entering each chunk: "kept" from the forward,
  // or "recomputed"; empty for other cases.
  virtual std::string bwd_states() const { return {}; }
};

struct ImplRow {
  std::string op;    // an op's name (core/op.hpp)
  std::string impl;  // one of that op's forms
  // Why this row cannot run the case here (dtype, sizes, the device's limits), or nothing.
  std::function<std::optional<std::string>(const Case&)> unsupported;
  std::function<std::unique_ptr<PreparedCase>(const Case&, const TensorSet& inputs)> prepare;
  // Bytes the backend will hold for the case (its copies of the tensors and the kernel's scratch).
  std::function<std::size_t(const Case&)> memory_estimate;
  // The name of the kernel variant that runs a case this row supports (the op's variant table,
  // kernels/<op>/*_variants.cpp), which --list-cases shows and records carry; null: the row has one.
  std::function<std::string(const Case&)> variant = nullptr;
};

struct Backend {
  std::string name;
  std::function<Availability()> availability;
  // The `device` block; may measure (the CPU's roofline, once per process).
  std::function<DeviceInfo()> describe;
  std::vector<ImplRow> impls;
  // True when the backend's memory is host RAM (the CPU), so that the run's own host buffers and
  // the backend's draw on the same pool.
  bool memory_is_host = false;
  // Bytes free where the backend holds its tensors; empty when it cannot tell.
  std::function<std::size_t()> memory_available;
  // A quick re-measurement of the peak (GFLOP/s), taken just before and after each case, where
  // the backend has one (docs/results.md, blas_gflops_now).
  std::function<std::optional<double>()> peak_check;
  // A quick re-measurement of the DRAM bandwidth (GB/s, the start-up triad's kind), taken just
  // before and after each cold case of an op with a byte model, where the backend has one: on a
  // shared host the memory's rate moves by 2x over seconds (docs/results.md, stream_gbytes_per_s_now).
  std::function<std::optional<double>()> stream_check;
  // Which AMX tiles ran a case whose `variant` runs on them ("hardware", "emulated" or "counted"),
  // "" for any other case; null where the backend has no AMX rows.
  std::function<std::string(const Case&, const std::string& variant)> amx_tiles;
  // A case on counted tiles: one more call outside any timed region, and the tile instructions it
  // executed by name (Measurement::tile_counts).
  std::function<std::map<std::string, std::uint64_t>(PreparedCase&)> count_tiles;

  const ImplRow* find(const std::string& op, const std::string& impl) const;
  // Why the case cannot run here: no row for it, or its row's reason; nothing when it can.
  std::optional<std::string> unsupported(const Case& kase) const;
  // The variant its row names for the case, or "".
  std::string variant(const Case& kase) const;
};

struct BackendOptions {
  int threads = 0;    // CPU threads for the whole run; 0: every core
  int device = 0;     // GPU index (CUDA backend)
  // Chunked fwd_bwd: the forward keeps the chunk states for the backward where the backend can
  // (the CPU tiled path; the CUDA kernel suite's chunked form), else the backward recomputes them.
  // Records say which (`bwd_states`).
  bool keep_chunk_states = true;
  // Loaded plugins (src/plugins/plugins.hpp): each backend's table gains a row per impl of its device.
  std::vector<std::shared_ptr<const LoadedPlugin>> plugins = {};
  // How the CPU kernels' runtime choices are decided (backends/cpu/tuning.hpp): "default" (here, so
  // that a backend made in a test is deterministic), "shipped", "auto" (the command line's default)
  // or "calibrate".
  std::string tuning = "default";
  // The tiles the CPU's AMX rows run on (LATTN_AMX): "hardware", "emulated", "counted" or "none";
  // empty: the CPU's own (the hardware where it has AMX, else the rows decline).
  std::string amx_tiles = {};
};

// What the backends need the process environment to say before any library reads it (the CPU
// backend's OpenMP spin count and OpenBLAS core). The first thing main does; it may re-execute the
// program with them set, and then does not return.
void prepare_process_environment(char** argv);

// Every backend this build knows, available here or not ("cpu" always; "cuda" when built).
std::vector<std::string> backend_names();
// Throws UsageError when `name` is unknown or not built in this binary.
std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options);

}  // namespace lattn
