#include "src/run/case_run.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "src/run/bandwidth_roof.hpp"
#include "src/run/check.hpp"
#include "core/error.hpp"
#include "core/op.hpp"
#include "src/run/cost.hpp"
#include "src/results/environment.hpp"
#include "src/run/harness.hpp"
#include "src/run/interrupt.hpp"
#include "src/results/npy.hpp"
#include "src/config/plan.hpp"

namespace lattn {

std::string reference_key(const Case& c) {
  std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}", c.op->name, c.batch, c.heads, c.seq, c.dim, c.window,
                                c.decay, c.dtype);
  for (const auto& [name, value] : c.options) key += "|" + name + "=" + value;
  return key;
}

namespace {

// Host bytes the run itself holds for a case beyond the backend: the cached inputs (float32), their
// float64 copies and the case's own input copy; the float64 reference outputs and the outputs read
// back. Counted for fwd_bwd's tensors whatever the mode, as the cache holds them.
std::size_t host_estimate(const Case& c) {
  return case_input_elems(c, true) * (4 + 8 + 4) + case_output_elems(c, true) * (8 + 4);
}

void dump_case(const std::string& dir, const Case& c, const TensorSet& inputs, const TensorSet& outputs) {
  const std::filesystem::path folder = std::filesystem::path(dir) / case_slug(c);
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) throw_file_error("cannot make the dump folder " + folder.string(), ec.value());
  for (const TensorSet* set : {&inputs, &outputs})
    for (const Tensor& t : *set) write_npy((folder / (t.name + ".npy")).string(), t.data.data(), t.shape);
}

TimingSettings timing_settings(const RunSettings& run) {
  return TimingSettings{run.warmup, run.reps, run.min_sample_ms, run.min_samples, run.max_noise, run.timeout, run.slowdown};
}

// `part`'s outputs: the first elements of each of the whole case's (Op::check_part).
TensorSet first_elements(const Case& part, const TensorSet& whole) {
  TensorSet out = make_case_outputs(part);
  std::vector<std::string> names;
  for (const Tensor& t : out) names.push_back(t.name);
  for (const std::string& name : names) {
    std::vector<float>& to = out.at(name).data;
    const std::vector<float>& from = whole.at(name).data;
    if (from.size() < to.size()) throw std::logic_error("check_part: " + name + " is not a prefix of the case's");
    std::copy(from.begin(), from.begin() + std::ptrdiff_t(to.size()), to.begin());
  }
  return out;
}

// The DRAM rate now, for a cold case of an op with a byte model where the backend re-measures it.
std::optional<double> stream_now(RunContext& ctx, const Case& c) {
  if (!c.op->bytes || !cache_cold(c) || !ctx.backend.stream_check) return std::nullopt;
  return ctx.backend.stream_check();
}

// A case between its preparation and its check.
struct InFlight {
  const Case* c = nullptr;
  std::shared_ptr<const ReferenceCache::Entry> shared;
  TensorSet inputs;
  std::unique_ptr<PreparedCase> prepared;
  std::unique_ptr<Sampler> sampler;
  std::optional<double> peak_before;
  std::optional<double> stream_before;  // a cold bandwidth-bound case's DRAM rate just before it
  std::string variant;  // the kernel variant the row runs the case with, or ""
};

// Inputs, reference and the prepared case (slowed by --slowdown, a testing aid), then its cold
// call, warm-up and calibration.
std::unique_ptr<InFlight> begin_case(RunContext& ctx, const ImplRow& row, const Case& c) {
  const auto& run = ctx.request.config.run;
  auto f = std::make_unique<InFlight>();
  f->c = &c;
  f->shared = ctx.cache.get(c, run.seed);
  throw_if_stop_requested();
  f->stream_before = stream_now(ctx, c);
  f->inputs = f->shared->inputs.inputs_for(c.mode);
  f->prepared = with_slowdown(row.prepare(c, f->inputs), run.slowdown);
  if (row.variant) f->variant = row.variant(c);
  f->sampler = std::make_unique<Sampler>(*f->prepared, timing_settings(run));
  f->sampler->start();
  return f;
}

// A memory-bound op's figures (core/op.hpp, Op::bytes): against the roof the case meets
// (src/run/bandwidth_roof.hpp): DRAM for a cold case, the start-up sweep's rate at a warm one's
// working set.
// `dram_now`: the DRAM rate re-measured around the case (0: none), the roof where it is larger.
void put_bandwidth(Measurement& m, const Case& c, const MemoryUsage& memory, const DeviceInfo& device, double seconds,
                   double dram_now) {
  if (!(seconds > 0)) return;
  const double tokens = double(c.batch) * c.seq;
  m.tokens_per_s = tokens / seconds;
  m.us_per_token = seconds * 1e6 / c.seq;
  // What a call keeps touching: its outputs and scratch (for the decode step, the states it steps in
  // place; the pristine copy they are re-seeded from is not touched while it is timed).
  const double resident = double(memory.out_bytes + memory.temp_bytes);
  m.working_set_bytes = resident;
  const BandwidthRoof roof = bandwidth_roof(cache_cold(c), resident, device.bandwidth_sweep(), device.cache_roofs(),
                                            std::max(device.stream_gbytes_per_s(), dram_now));
  m.bandwidth_roof = roof.name;
  if (roof.gbytes_per_s) {
    m.bandwidth_roof_gbytes_per_s = *roof.gbytes_per_s;
    m.bandwidth_fraction = m.gbytes_per_s / *roof.gbytes_per_s;
    m.above_roof = *m.bandwidth_fraction > kAboveCeiling;
  }
}

// A case on counted tiles: the counts of one call, and the tdpbf16ps' time at the AMX rate the
// device block measured, else at the documented 1024 flops a cycle a core (one 16 x 16 x 32
// tdpbf16ps every 16 cycles) at the host's clock and the run's threads.
void put_tile_model(Measurement& m, const DeviceInfo& device, const std::map<std::string, std::uint64_t>& counts) {
  m.tile_counts = counts;
  const auto dp = counts.find("tdpbf16ps");
  if (dp == counts.end()) return;
  const double flops = double(dp->second) * 2.0 * 16 * 16 * 32;
  if (device.cpu && device.cpu->amx_gflops && *device.cpu->amx_gflops > 0) {
    m.tile_rate_gflops = *device.cpu->amx_gflops;
    m.tile_rate_source = "amx_gflops";
  } else if (device.host.cpu_mhz && device.host.threads > 0) {
    m.tile_rate_gflops = 1024.0 * *device.host.cpu_mhz * 1e-3 * device.host.threads;
    m.tile_rate_source = fmt::format("1024 flops a cycle a core at cpu_mhz {:.0f} x {} threads (no amx_gflops measured)",
                                     *device.host.cpu_mhz, device.host.threads);
  } else {
    return;
  }
  m.tile_model_ms = flops / (*m.tile_rate_gflops * 1e9) * 1e3;
}

// Its outputs checked against the float64 reference and its figures: the record's measurement.
Measurement finish_case(RunContext& ctx, InFlight& f) {
  const auto& run = ctx.request.config.run;
  const Case& c = *f.c;
  const Timing timing = f.sampler->timing();
  f.prepared->watch_scratch();  // after the samples: a Python impl's own allocator watched in a call of its own
  TensorSet outputs = make_case_outputs(c);
  f.prepared->read_outputs(outputs);
  const MemoryUsage memory = f.prepared->memory();

  Measurement m;
  m.variant = f.variant;
  if (ctx.backend.amx_tiles) m.amx_tiles = ctx.backend.amx_tiles(c, f.variant);
  // Counted tiles compute nothing: the outputs are not results, so the case is timed, not checked.
  const bool counted = m.amx_tiles == "counted";
  if (counted) {
    m.unchecked = "ran on counted AMX tiles (LATTN_AMX=counted), which compute nothing: timed, not checked";
  } else {
    const CheckResult check = f.shared->part ? check_outputs(*f.shared->part, first_elements(*f.shared->part, outputs),
                                                           f.shared->reference)
                                             : check_outputs(c, outputs, f.shared->reference);
    m.check_failure = check.failure();
    if (f.shared->part) m.checked_pairs = f.shared->part->batch * f.shared->part->heads;
    m.rel_err = check.rel_err;
    m.rel_errs = check.per_output;
    m.tolerance = check.tolerance;
  }
  m.compile_s = timing.compile_s;
  m.warmup = run.warmup;
  m.inner = timing.inner;
  m.reps = int(timing.samples_ms.size());
  m.samples_ms = timing.samples_ms;
  m.samples_cpu_ms = timing.samples_cpu_ms;
  m.noise_pct = timing.noise_pct;
  m.stopped_on = to_string(timing.stopped_on);
  m.median_ms = timing.stats.median;
  m.q1_ms = timing.stats.q1;
  m.q3_ms = timing.stats.q3;
  m.min_ms = timing.stats.min;
  m.max_ms = timing.stats.max;
  m.mean_ms = timing.stats.mean;
  m.short_samples = timing.short_samples;
  m.temp_mb = double(memory.temp_bytes) / kMiB;
  m.temp_unknown = memory.temp_uncounted;
  if (m.temp_unknown.empty()) m.temp_source = memory.temp_source;
  if (!memory.layout.empty()) {
    m.layout = memory.layout;
    m.layout_copy_mb = double(memory.layout_copy_bytes) / kMiB;
  }
  m.arg_mb = double(memory.arg_bytes) / kMiB;
  m.out_mb = double(memory.out_bytes) / kMiB;
  const double seconds = timing.stats.median * 1e-3;
  m.flops = c.op->flops(c);
  m.bytes = c.op->bytes ? c.op->bytes(c) : case_min_bytes(memory);
  m.gflops = seconds > 0 ? m.flops / seconds * 1e-9 : 0.0;
  m.gbytes_per_s = seconds > 0 ? m.bytes / seconds * 1e-9 : 0.0;
  if (c.op->bytes) {
    const std::optional<double> after = stream_now(ctx, c);
    if (f.stream_before || after) m.stream_gbytes_per_s_now = std::max(f.stream_before.value_or(0), after.value_or(0));
    put_bandwidth(m, c, memory, ctx.device, seconds, m.stream_gbytes_per_s_now.value_or(0));
  }
  m.bwd_states = f.prepared->bwd_states();
  if (counted && ctx.backend.count_tiles) put_tile_model(m, ctx.device, ctx.backend.count_tiles(*f.prepared));
  if (timing.stats.median * 1e6 < 10 * ctx.timer.resolution_ns)
    m.timer_warning = fmt::format("per-call time {:.1f} ns is within 10x of the timer's resolution ({:.1f} ns)",
                                  timing.stats.median * 1e6, ctx.timer.resolution_ns);

  // Against the compute ceiling (the larger of the FMA rate and sgemm: the hardware's; the AMX rate
  // for a bf16 case on AMX tiles), the roofline
  // (the rate a case of this arithmetic intensity can reach at the measured bandwidth, if below the
  // ceiling: memory-bound, small D, long sequences), and the BLAS's start-up sgemm.
  // Not for a case on counted tiles: its flops were not all executed.
  const double peak = counted ? 0.0 : ctx.device.peak_gflops_for(c.dtype, f.variant),
               blas = counted ? 0.0 : ctx.device.blas_gflops(), stream = ctx.device.stream_gbytes_per_s();
  if (peak > 0) {
    m.peak_gflops = peak;
    m.peak_fraction = m.gflops / peak;
    m.above_ceiling = *m.peak_fraction > kAboveCeiling;
    if (stream > 0 && m.bytes > 0 && m.flops > 0) {
      const double roof = std::min(peak, m.flops / m.bytes * stream);
      m.roofline_gflops = roof;
      m.roofline_fraction = m.gflops / roof;
    }
  }
  if (blas > 0) {
    m.blas_gflops = blas;
    m.blas_fraction = m.gflops / blas;
  }
  if (!ctx.request.dump_dir.empty()) dump_case(ctx.request.dump_dir, c, f.inputs, outputs);
  return m;
}

}  // namespace

ReferenceCache::ReferenceCache(const std::vector<Case>& plan, int check_heads) : check_heads_(check_heads) {
  for (const Case& c : plan)
    if (c.backward()) backward_keys_.insert(reference_key(c));
}

Case ReferenceCache::reference_case(const Case& c) const {
  if (check_heads_ > 0 && c.op->check_part)
    if (std::optional<Case> part = c.op->check_part(c, check_heads_)) return *part;
  return c;
}

std::shared_ptr<const ReferenceCache::Entry> ReferenceCache::get(const Case& c, std::uint64_t seed) {
  const std::string key = reference_key(c);
  const bool backward = c.backward() || backward_keys_.count(key);
  auto it = entries_.find(key);
  if (it != entries_.end() && (!backward || it->second->reference.has_backward)) return it->second;
  // Free what no case in flight holds before making the new tensors.
  std::erase_if(entries_, [](const auto& entry) { return entry.second.use_count() == 1; });
  auto entry = std::make_shared<Entry>();
  entry->inputs = make_case_inputs(c, seed);
  if (Case part = reference_case(c); part.batch != c.batch || part.heads != c.heads) {
    // The part's inputs are the first elements of the case's (Op::check_part), made as such.
    entry->reference = c.op->reference(part, make_case_inputs(part, seed), backward);
    entry->part = std::move(part);
  } else {
    entry->reference = c.op->reference(c, entry->inputs, backward);
  }
  entries_[key] = entry;
  return entry;
}

bool ReferenceCache::backward(const Case& c) const { return c.backward() || backward_keys_.count(reference_key(c)) > 0; }

std::map<const Op*, ReferencePace> measure_reference_paces(const std::vector<const Case*>& cases, std::uint64_t seed,
                                                           const ReferenceCache& cache) {
  std::map<const Op*, const Case*> smallest;
  for (const Case* c : cases) {
    const Case*& least = smallest[c->op];
    if (!least || reference_flops(*c, false) < reference_flops(*least, false)) least = c;
  }
  const auto seconds_since = [](std::chrono::steady_clock::time_point start) {
    return std::max(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1e-4);
  };
  std::map<const Op*, ReferencePace> paces;
  for (const auto& [op, c] : smallest) {
    ReferencePace& pace = paces[op];
    if (stop_requested()) continue;  // the run ends before its first case: no pace is needed
    try {
      const bool backward = cache.backward(*c);
      auto start = std::chrono::steady_clock::now();
      const TensorSet inputs = make_case_inputs(*c, seed);
      pace.input_elems_per_s = double(case_input_elems(*c, true)) / seconds_since(start);
      start = std::chrono::steady_clock::now();
      op->reference(*c, inputs, backward);
      pace.gflops = reference_flops(*c, backward) / seconds_since(start) * 1e-9;
    } catch (const std::exception&) {  // Interrupted among them: the run stops before its first case
      pace = ReferencePace{};
    }
  }
  return paces;
}

MemoryNeed memory_need(const Backend& backend, const ImplRow& row, const Case& c) {
  const double backend_need = row.memory_estimate ? double(row.memory_estimate(c)) : 0.0;
  return {double(host_estimate(c)) + (backend.memory_is_host ? backend_need : 0.0), backend.memory_is_host ? 0.0 : backend_need};
}

std::optional<std::string> memory_guard(const Backend& backend, const ImplRow& row, const Case& c) {
  const MemoryNeed need = memory_need(backend, row, c);
  const double host_free = double(available_host_memory());
  if (need.host > host_free)
    return fmt::format("needs about {:.0f} MiB of host memory, {:.0f} MiB available", need.host / kMiB, host_free / kMiB);
  if (!backend.memory_is_host && backend.memory_available) {
    const double free = double(backend.memory_available());
    if (need.device > free)
      return fmt::format("needs about {:.0f} MiB of {} memory, {:.0f} MiB free", need.device / kMiB, backend.name,
                         free / kMiB);
  }
  return std::nullopt;
}

CaseRecord skipped(const Case& c, std::string why) {
  CaseRecord r;
  r.kase = c;
  r.status = Status::skipped;
  r.skip_reason = std::move(why);
  return r;
}

Measurement run_case(RunContext& ctx, const ImplRow& row, const Case& c) {
  const auto f = begin_case(ctx, row, c);
  while (!f->sampler->done()) f->sampler->sample();
  return finish_case(ctx, *f);
}

CaseRecord measured_record(const Case& c, Measurement m, std::optional<double> peak_before,
                           std::optional<double> peak_after, std::string& note) {
  if (peak_before && peak_after) {
    m.blas_gflops_now = std::max(*peak_before, *peak_after);
    m.blas_fraction_now = m.gflops / *m.blas_gflops_now;
  }
  CaseRecord r;
  r.kase = c;
  r.status = !m.unchecked.empty() ? Status::unchecked : m.check_failure.empty() ? Status::ok : Status::failed;
  note = fmt::format("median {:.4f} ms, noise {:.1f}% ({} samples, stopped on {}), ", m.median_ms, m.noise_pct,
                     m.samples_ms.size(), m.stopped_on);
  note += r.status == Status::unchecked ? "unchecked: " + m.unchecked : fmt::format("rel_err {:.2e}", m.rel_err);
  if (r.status == Status::failed) note += " FAILED: " + m.check_failure;
  r.measured = std::move(m);
  return r;
}

CaseRecord failure_record(const Case& c, const std::exception_ptr& error, std::string& note) {
  CaseRecord r;
  r.kase = c;
  try {
    std::rethrow_exception(error);
  } catch (const Interrupted&) {
    throw;
  } catch (const EnvironmentError&) {
    throw;
  } catch (const std::bad_alloc&) {
    r = skipped(c, "memory: an allocation failed");
    note = "skipped: memory: an allocation failed";
  } catch (const std::exception& e) {
    r.status = Status::failed;
    r.error = e.what();
    note = std::string("FAILED: ") + e.what();
  }
  return r;
}

namespace {

// A stop request in the middle of a batch: every case in flight with at least one sample is checked
// and recorded with the samples it has (stopped_on "interrupted"), so that what was measured is not
// lost; cases without a sample are left unrecorded. Its outputs are those of its last call.
void keep_interrupted(RunContext& ctx, std::vector<std::unique_ptr<InFlight>>& active, const BatchEvents& events) {
  for (auto& f : active) {
    if (!f || f->sampler->timing().samples_ms.empty()) continue;
    f->sampler->interrupt();
    std::string note;
    CaseRecord record;
    try {
      record = measured_record(*f->c, finish_case(ctx, *f), f->peak_before, std::nullopt, note);
    } catch (const EnvironmentError&) {
      throw;
    } catch (...) {  // the check of a partial case failed to run: it is left for --resume
      continue;
    }
    if (!events.finished(*f->c, std::move(record), note)) return;
    f.reset();
  }
}

}  // namespace

void run_batch(RunContext& ctx, const std::vector<const Case*>& cases, const BatchEvents& events) {
  const auto peak = [&]() { return ctx.backend.peak_check ? ctx.backend.peak_check() : std::nullopt; };
  const auto outcome = [&](const Case& c, const std::exception_ptr& error) -> bool {
    std::string note;
    CaseRecord record = failure_record(c, error, note);
    return events.finished(c, std::move(record), note);
  };

  std::vector<std::unique_ptr<InFlight>> active;
  for (const Case* c : cases) {
    try {
      const std::optional<double> before = peak();
      active.push_back(begin_case(ctx, *ctx.backend.find(c->op->name, c->impl), *c));
      active.back()->peak_before = before;
    } catch (...) {
      if (!outcome(*c, std::current_exception())) return;
      continue;
    }
    if (events.started) events.started(*c);
  }

  if (events.prepared) events.prepared();
  std::mt19937_64 order_rng(ctx.request.config.run.seed ^ 0x9e3779b97f4a7c15ull);
  try {
    for (int round = 1; !active.empty(); ++round) {
      std::vector<std::size_t> order(active.size());
      for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::shuffle(order.begin(), order.end(), order_rng);
      for (const std::size_t i : order) {
        InFlight& f = *active[i];
        bool go_on = true;
        try {
          f.sampler->sample();
          if (events.sampled) events.sampled(*f.c);
          if (!f.sampler->done()) continue;
          std::string note;
          Measurement m = finish_case(ctx, f);
          CaseRecord record = measured_record(*f.c, std::move(m), f.peak_before, peak(), note);
          go_on = events.finished(*f.c, std::move(record), note);
        } catch (const Interrupted&) {
          throw;
        } catch (...) {
          go_on = outcome(*f.c, std::current_exception());
        }
        active[i].reset();  // frees its tensors; the reference goes with the last case holding it
        if (!go_on) return;
      }
      std::erase_if(active, [](const auto& f) { return !f; });
      if (events.round_done) events.round_done(round, active.size());
    }
  } catch (const Interrupted&) {
    keep_interrupted(ctx, active, events);
    throw;
  }
}

}  // namespace lattn
