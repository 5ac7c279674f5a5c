// A case's way through the harness: its inputs and float64 reference (shared by the cases of one
// shape), the prepared case, the sampler, the check and the measurement of its record; and a batch
// of cases whose samples are taken in rounds over the cases (--interleave, docs/harness.md).
// src/run/runner.cpp decides the batches and journals and reports what they finish.
#pragma once

#include <exception>
#include <functional>
#include <map>
#include <set>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "src/run/backend.hpp"
#include "src/results/record.hpp"
#include "src/run/runner.hpp"

namespace lattn {

inline constexpr double kMiB = 1024.0 * 1024.0;

// Inputs and the float64 reference per key (op, shape, decay, window, options, dtype: never the
// impl, mode or chunk). The first case of a key computes the gradients too when any case of that
// key needs them, so that the (slow) float64 reference runs once. An entry lives while a case in
// flight holds it, and the last one made stays for the next case of its key: when a new key is
// made, the entries nobody holds are freed first.
std::string reference_key(const Case& c);

class ReferenceCache {
 public:
  struct Entry {
    TensorSet inputs;  // every input and cotangent (fwd_bwd's superset)
    Reference reference;  // of the case, or of `part` where one is checked
    std::optional<Case> part;  // the first pairs checked (Op::check_part), else the whole case
  };

  // check_heads: the run's (RunSettings::check_heads), 0 for every output element.
  explicit ReferenceCache(const std::vector<Case>& plan, int check_heads = 0);
  // The case whose reference is made for `c`: its part where one is checked, else `c`.
  Case reference_case(const Case& c) const;
  std::shared_ptr<const Entry> get(const Case& c, std::uint64_t seed);
  // Whether the reference of `c`'s key is made with its gradients (some case of the key needs them).
  bool backward(const Case& c) const;

 private:
  std::set<std::string> backward_keys_;
  int check_heads_ = 0;
  std::map<std::string, std::shared_ptr<const Entry>> entries_;
};

struct RunContext {
  const RunRequest& request;
  Backend& backend;
  const DeviceInfo& device;
  ReferenceCache cache;
  TimerInfo timer;
};

// Host and device bytes a case needs: the run's own host copies (inputs, their float64 copies,
// the reference outputs, the outputs read back) and the backend's estimate, counted on the host
// when the backend's memory is host memory.
// The paces of a reference key's work here and now, for the time estimate.
struct ReferencePace {
  double gflops = 0;             // the float64 reference, by reference_flops; 0 when it failed
  double input_elems_per_s = 0;  // the inputs it is made from, by case_input_elems' fwd_bwd superset
};
// Per op, from its smallest case of `cases` (by its reference's flops): its inputs and its reference
// timed apart, the reference with the gradients when `cache` makes that key's with them. Apart, since
// the inputs cost by the element and the reference by the flop: in one figure, the inputs of the
// smallest case (a small head dim: many elements per flop) made every larger reference look twice
// as slow as it is.
std::map<const Op*, ReferencePace> measure_reference_paces(const std::vector<const Case*>& cases, std::uint64_t seed,
                                                           const ReferenceCache& cache);

struct MemoryNeed {
  double host = 0, device = 0;
};
MemoryNeed memory_need(const Backend& backend, const ImplRow& row, const Case& c);
// Why the case does not fit in the memory available now, or nothing.
std::optional<std::string> memory_guard(const Backend& backend, const ImplRow& row, const Case& c);

CaseRecord skipped(const Case& c, std::string why);

// Measures one case from its cold call to its check, its samples one after another.
Measurement run_case(RunContext& ctx, const ImplRow& row, const Case& c);

// The record of a measured case with the peak re-measured before and after it (CPU), and its
// progress note.
CaseRecord measured_record(const Case& c, Measurement m, std::optional<double> peak_before,
                           std::optional<double> peak_after, std::string& note);

// What a case that threw becomes: a skip for memory (std::bad_alloc), else a failure naming the
// error; Interrupted and EnvironmentError, the run's own stops, are thrown on.
CaseRecord failure_record(const Case& c, const std::exception_ptr& error, std::string& note);

struct BatchEvents {
  // A case finished (its record: measured and checked, failed, or skipped for memory); false
  // stops the batch there (the disk refused its journal line).
  std::function<bool(const Case&, CaseRecord, const std::string& note)> finished;
  std::function<void(const Case&)> started;  // cold call, warm-up and calibration done
  std::function<void()> prepared;            // every case of the batch started: the rounds begin
  std::function<void(const Case&)> sampled;  // one sample taken
  std::function<void(int round, std::size_t sampling)> round_done;
};

// The cases (each supported by its row and inside the memory guard), prepared and started one
// after another, then their samples in rounds, each round over the cases still sampling in an
// order drawn from `seed` and the round; a case is checked, recorded and finished right after its
// last sample. A case that throws fails alone; Interrupted and EnvironmentError (a dump the disk
// refused) end the batch, the cases in flight unrecorded.
void run_batch(RunContext& ctx, const std::vector<const Case*>& cases, const BatchEvents& events);

}  // namespace lattn
