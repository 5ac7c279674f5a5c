#include "src/results/record_json.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "core/error.hpp"
#include "core/op.hpp"
#include "src/config/config.hpp"
#include "src/results/summary.hpp"

namespace lattn {

std::string to_string(Status status) {
  switch (status) {
    case Status::ok: return "ok";
    case Status::failed: return "failed";
    case Status::skipped: return "skipped";
    case Status::unchecked: return "unchecked";
  }
  return "?";
}

nlohmann::json identity_json(const Case& c) {
  const Op& op = *c.op;
  nlohmann::json id = {{"suite", op.suite}, {"impl", c.impl},   {"mode", to_string(c.mode)},
                       {"backend", c.backend}, {"dtype", c.dtype}, {"batch", c.batch},
                       {"heads", c.heads},     {"seq", c.seq},     {"dim", c.dim},
                       {"plan_index", c.plan_index}};
  if (op.has(Param::decay)) id["decay"] = c.decay;
  if (op.has(Param::chunk)) id["chunk"] = c.chunk;
  if (op.has(Param::window)) id["window"] = c.window;
  for (const Axis& axis : op.axes)
    if (axis.param == Param::option && c.options.count(axis.key) && option_recorded(axis, c.options.at(axis.key)))
      id[axis.key] = axis_value_json(axis, c.options.at(axis.key));
  if (op.extra_identity)
    for (const auto& [key, value] : op.extra_identity(c)) id[key] = value;
  return id;
}

namespace {

template <class T>
void put(nlohmann::json& j, const char* key, const std::optional<T>& value) {
  if (value) j[key] = *value;
}

// JSON has no infinity: a non-finite rel_err is written as null and read back as +inf.
nlohmann::json error_value(double e) { return std::isfinite(e) ? nlohmann::json(e) : nlohmann::json(nullptr); }
double error_from(const nlohmann::json& j, const std::string& where) {
  if (j.is_null()) return std::numeric_limits<double>::infinity();
  if (!j.is_number()) throw UsageError(where, "the journal record's rel_err or rel_errs holds " + j.dump() + ", not a number");
  return j.get<double>();
}

// The measurement's keys, one table for both directions (written here, read back on --resume):
// the required numbers, the optional numbers (absent: not measured), and the texts left out when
// empty.
struct DoubleKey {
  const char* key;
  double Measurement::*member;
};
struct IntKey {
  const char* key;
  int Measurement::*member;
};
struct OptionalKey {
  const char* key;
  std::optional<double> Measurement::*member;
};
struct TextKey {
  const char* key;
  std::string Measurement::*member;
};
constexpr DoubleKey kDoubles[] = {
    {"compile_s", &Measurement::compile_s}, {"median_ms", &Measurement::median_ms}, {"q1_ms", &Measurement::q1_ms},
    {"q3_ms", &Measurement::q3_ms},         {"min_ms", &Measurement::min_ms},       {"max_ms", &Measurement::max_ms},
    {"mean_ms", &Measurement::mean_ms},     {"tolerance", &Measurement::tolerance}, {"temp_mb", &Measurement::temp_mb},
    {"arg_mb", &Measurement::arg_mb},       {"out_mb", &Measurement::out_mb},       {"flops", &Measurement::flops},
    {"gflops", &Measurement::gflops},       {"bytes", &Measurement::bytes},         {"gbytes_per_s", &Measurement::gbytes_per_s},
    {"noise_pct", &Measurement::noise_pct},
};
constexpr IntKey kInts[] = {{"warmup", &Measurement::warmup},
                            {"inner", &Measurement::inner},
                            {"reps", &Measurement::reps},
                            {"short_samples", &Measurement::short_samples}};
constexpr OptionalKey kOptionals[] = {
    {"peak_gflops", &Measurement::peak_gflops},         {"peak_fraction", &Measurement::peak_fraction},
    {"roofline_gflops", &Measurement::roofline_gflops}, {"roofline_fraction", &Measurement::roofline_fraction},
    {"blas_gflops", &Measurement::blas_gflops},         {"blas_fraction", &Measurement::blas_fraction},
    {"blas_gflops_now", &Measurement::blas_gflops_now}, {"blas_fraction_now", &Measurement::blas_fraction_now},
    {"bandwidth_fraction", &Measurement::bandwidth_fraction}, {"tokens_per_s", &Measurement::tokens_per_s},
    {"us_per_token", &Measurement::us_per_token}, {"layout_copy_mb", &Measurement::layout_copy_mb},
    {"stream_gbytes_per_s_now", &Measurement::stream_gbytes_per_s_now},
    {"bandwidth_roof_gbytes_per_s", &Measurement::bandwidth_roof_gbytes_per_s},
    {"working_set_bytes", &Measurement::working_set_bytes},
    {"tile_model_ms", &Measurement::tile_model_ms}, {"tile_rate_gflops", &Measurement::tile_rate_gflops},
};
constexpr TextKey kTexts[] = {{"stopped_on", &Measurement::stopped_on},
                              {"check_failure", &Measurement::check_failure},
                              {"bwd_states", &Measurement::bwd_states},
                              {"variant", &Measurement::variant},
                              {"timer_warning", &Measurement::timer_warning},
                              {"bandwidth_roof", &Measurement::bandwidth_roof},
                              {"temp_mb_unknown", &Measurement::temp_unknown},
                              {"temp_mb_source", &Measurement::temp_source},
                              {"layout", &Measurement::layout},
                              {"unchecked_reason", &Measurement::unchecked},
                              {"amx_tiles", &Measurement::amx_tiles},
                              {"tile_rate_source", &Measurement::tile_rate_source}};

void put_measurement(nlohmann::json& r, const Measurement& m) {
  for (const DoubleKey& k : kDoubles) r[k.key] = m.*k.member;
  for (const IntKey& k : kInts) r[k.key] = m.*k.member;
  for (const OptionalKey& k : kOptionals) put(r, k.key, m.*k.member);
  for (const TextKey& k : kTexts)
    if (!(m.*k.member).empty()) r[k.key] = m.*k.member;
  if (!m.temp_unknown.empty()) r["temp_mb"] = nullptr;  // not 0: the scratch was not counted
  r["samples_ms"] = m.samples_ms;
  if (!m.samples_cpu_ms.empty()) r["samples_cpu_ms"] = m.samples_cpu_ms;
  if (!m.tile_counts.empty()) r["tile_counts"] = m.tile_counts;
  if (m.unchecked.empty()) {  // an unchecked record has no errors: its outputs are not results
    r["rel_err"] = error_value(m.rel_err);
    nlohmann::json errors = nlohmann::json::object();
    for (const auto& [name, e] : m.rel_errs) errors[name] = error_value(e);
    r["rel_errs"] = errors;
  }
  if (m.peak_fraction) r["above_ceiling"] = m.above_ceiling;
  if (m.bandwidth_fraction) r["above_roof"] = m.above_roof;
  if (m.checked_pairs > 0) r["checked_pairs"] = m.checked_pairs;
}

}  // namespace

nlohmann::json to_json(const CaseRecord& record) {
  nlohmann::json r = identity_json(record.kase);
  r["status"] = to_string(record.status);
  if (!record.skip_reason.empty()) r["skip_reason"] = record.skip_reason;
  if (!record.error.empty()) r["error"] = record.error;
  if (record.measured) put_measurement(r, *record.measured);
  return r;
}

nlohmann::json to_json(const DeviceInfo& d) {
  const HostInfo& h = d.host;
  nlohmann::json j = {
      {"backend", d.backend},     {"cpu_model", h.cpu_model},   {"cpu_cores", h.cpu_cores},
      {"threads", h.threads},     {"hostname", h.hostname},     {"os", h.os},
      {"compiler", h.compiler},   {"build_type", h.build_type}, {"cxx_flags", h.cxx_flags},
      {"lattnbench_version", h.version}, {"git_revision", h.git_revision}, {"git_dirty", h.git_dirty},
  };
  if (!h.cpu_signature.empty()) j["cpu_signature"] = h.cpu_signature;
  put(j, "cpu_mhz", h.cpu_mhz);
  if (!h.cache_kib.empty()) j["cache_kib"] = h.cache_kib;
  j["cpu_scaling_enabled"] = h.cpu_scaling_enabled;
  j["load_avg"] = h.load_avg;
  if (const auto& c = d.cpu) {
    j["blas"] = c->blas;
    j["blas_version"] = c->blas_version;
    j["blas_threads_inside_kernels"] = c->blas_threads_inside_kernels;
    j["blas_core"] = c->blas_core;
    put(j, "blas_coretype_env", c->blas_coretype_env);
    put(j, "blas_core_detected", c->blas_core_detected);
    j["omp_wait_policy"] = c->omp_wait_policy;
    put(j, "gomp_spincount", c->gomp_spincount);
    put(j, "env_set_by_lattnbench", c->env_set_by_lattnbench);
    j["scan_vector_width"] = c->scan_vector_width;
    j["sgemm_gflops"] = c->sgemm_gflops;
    j["sgemm_n"] = c->sgemm_n;
    j["sgemm_threads"] = c->sgemm_threads;
    j["sgemm_products"] = c->sgemm_products;
    j["sgemm_median_gflops"] = c->sgemm_median_gflops;
    j["sgemm_seconds"] = c->sgemm_seconds;
    j["stream_gbytes_per_s"] = c->stream_gbytes_per_s;
    j["stream_bytes"] = c->stream_bytes;
    if (!c->bandwidth_sweep.empty()) {
      nlohmann::json sweep = {{"bytes", nlohmann::json::array()}, {"gbytes_per_s", nlohmann::json::array()}};
      for (const BandwidthPoint& point : c->bandwidth_sweep) {
        sweep["bytes"].push_back(point.bytes);
        sweep["gbytes_per_s"].push_back(point.gbytes_per_s);
      }
      sweep["seconds"] = c->bandwidth_sweep_seconds;
      j["bandwidth_sweep"] = sweep;
    }
    for (const CacheRoof& roof : c->cache_roofs) {
      j["cache_gbytes_per_s"][roof.level] = roof.gbytes_per_s;
      j["cache_roof_bytes"][roof.level] = roof.capacity_bytes;
    }
    for (const CacheRoof& cache : c->sysfs_caches) j["sysfs_cache_bytes"][cache.level] = cache.capacity_bytes;
    put(j, "fma_gflops", c->fma_gflops);
    put(j, "amx_gflops", c->amx_gflops);
    if (!c->layer_products.empty()) j["layer_products"] = c->layer_products;
    if (const auto& t = c->tuning) {
      nlohmann::json tuning = {{"source", t->source}, {"vector_width", t->vector_width}};
      nlohmann::json choices = nlohmann::json::object();
      auto value_of = [](const TuningInfo::Choice& choice) {
        return choice.label.empty() ? nlohmann::json(choice.value) : nlohmann::json(choice.label);
      };
      for (const TuningInfo::Choice& choice : t->choices) choices[choice.kernel][choice.name] = value_of(choice);
      tuning["choices"] = choices;
      if (!t->exhaustive.empty()) {
        nlohmann::json groups = nlohmann::json::array();
        for (const TuningInfo::PlanGap& g : t->exhaustive) {
          nlohmann::json best = nlohmann::json::object();
          for (const TuningInfo::Choice& choice : g.best) best[choice.kernel][choice.name] = value_of(choice);
          groups.push_back({{"kernel", g.kernel},
                            {"combinations", g.combinations},
                            {"quick_ms", g.quick_ms},
                            {"best_ms", g.best_ms},
                            {"quick_over_best", g.best_ms > 0 ? g.quick_ms / g.best_ms : 0.0},
                            {"best", best}});
        }
        tuning["exhaustive"] = groups;
      }
      put(tuning, "exhaustive_s", t->exhaustive_s);
      put(tuning, "microarchitecture", t->microarchitecture);
      put(tuning, "cache", t->cache);
      put(tuning, "calibration_s", t->calibration_s);
      put(tuning, "note", t->note);
      j["tuning"] = tuning;
    }
    const ComputeCeiling ceiling = d.ceiling();
    j["peak_gflops"] = ceiling.gflops;
    j["peak_source"] = ceiling.source;
    j["blas_gflops"] = c->sgemm_gflops;
  }
  if (const auto& c = d.cuda) {
    j["cuda_targets"] = c->cuda_targets;
    j["nvcc"] = c->nvcc;
    put(j, "cuda_runtime", c->cuda_runtime);
    put(j, "driver_cuda_version", c->driver_cuda_version);
    put(j, "driver", c->driver);
    put(j, "unavailable", c->unavailable);
    if (const auto& g = c->gpu) {
      j["device_index"] = g->device_index;
      j["gpu"] = g->name;
      j["compute_capability"] = g->compute_capability;
      j["sm_count"] = g->sm_count;
      j["gpu_memory_gb"] = g->memory_gb;
      j["l2_cache_mb"] = g->l2_cache_mb;
      j["shared_memory_per_block_optin_kb"] = g->shared_memory_per_block_optin_kb;
      j["memory_bus_width_bits"] = g->memory_bus_width_bits;
      put(j, "sm_clock_mhz", g->sm_clock_mhz);
      put(j, "memory_clock_mhz", g->memory_clock_mhz);
    } else {
      j["gpu"] = nullptr;
    }
  }
  if (const auto& t = d.timer)
    j["timer"] = {{"clock", "std::chrono::steady_clock"}, {"resolution_ns", t->resolution_ns}, {"overhead_ns", t->overhead_ns}};
  if (const auto& p = d.python)
    j["python"] = {{"version", p->version}, {"executable", p->executable}, {"bridge_call_us", p->bridge_call_us},
                   {"bridge_calls", p->bridge_calls}};
  return j;
}

nlohmann::json device_fingerprint(const DeviceInfo& device) {
  const nlohmann::json full = to_json(device);
  nlohmann::json fp = nlohmann::json::object();
  for (const char* key : {"backend", "cpu_model", "cpu_signature", "cpu_cores", "threads", "hostname", "gpu",
                          "compute_capability", "lattnbench_version", "git_revision"})
    if (full.contains(key)) fp[key] = full[key];
  return fp;
}

namespace {

// The identity keys that make two records the same shape (the summary's groups).
nlohmann::json shape_json(const Case& c, bool with_seq) {
  nlohmann::json id = identity_json(c), shape = nlohmann::json::object();
  for (const char* key : {"suite", "mode", "backend", "dtype", "decay", "batch", "heads", "dim", "chunk", "window",
                          "head_dim", "documents", "seq"})
    if (id.contains(key) && (with_seq || std::string(key) != "seq")) shape[key] = id[key];
  for (const auto& [key, text] : c.options)
    if (id.contains(key)) shape[key] = id[key];
  return shape;
}

}  // namespace

nlohmann::json to_json(const Summary& summary) {
  nlohmann::json comparisons = nlohmann::json::array(), crossovers = nlohmann::json::array();
  for (const Comparison& c : summary.comparisons) {
    nlohmann::json j = shape_json(c.fastest->kase, true);
    j["fastest"] = c.fastest->kase.impl;
    j["other"] = c.other->kase.impl;
    j["fastest_median_ms"] = c.fastest->measured->median_ms;
    j["other_median_ms"] = c.other->measured->median_ms;
    j["speedup"] = c.speedup;
    // null where the impl's scratch was not counted (a Python impl's), as in its record
    auto temp = [](const Measurement& m) { return m.temp_unknown.empty() ? nlohmann::json(m.temp_mb) : nlohmann::json(nullptr); };
    j["fastest_temp_mb"] = temp(*c.fastest->measured);
    j["other_temp_mb"] = temp(*c.other->measured);
    for (const CaseRecord* r : c.ranking)
      j["ranking"].push_back({{"impl", r->kase.impl}, {"median_ms", r->measured->median_ms}});
    comparisons.push_back(j);
  }
  for (const Crossover& x : summary.crossovers) {
    nlohmann::json j = shape_json(x.series->kase, false);
    j["winners"] = nlohmann::json::array();
    j["changes"] = nlohmann::json::array();
    for (const auto& [seq, impl] : x.winners) j["winners"].push_back({{"seq", seq}, {"fastest", impl}});
    for (const WinnerChange& ch : x.changes)
      j["changes"].push_back({{"after_seq", ch.after_seq}, {"by_seq", ch.by_seq}, {"from", ch.from}, {"to", ch.to}});
    crossovers.push_back(j);
  }
  // The records out of the comparisons: their shape, impl, status and why.
  nlohmann::json not_compared = nlohmann::json::array();
  for (const CaseRecord* r : summary.not_compared) {
    nlohmann::json j = shape_json(r->kase, true);
    j["impl"] = r->kase.impl;
    j["status"] = to_string(r->status);
    j["reason"] = why_not_passed(*r);
    not_compared.push_back(j);
  }
  return {{"comparisons", comparisons}, {"crossovers", crossovers}, {"not_compared", not_compared}};
}

// Every key that sets one record's case apart from another's (the ops' own keys among them), in the
// order first met (each record's keys by name): the Python tools key cases by this list rather than a
// copy of their own.
nlohmann::json identity_keys_json(const std::vector<CaseRecord>& records) {
  std::vector<std::string> keys;
  for (const CaseRecord& r : records) {
    const nlohmann::json id = identity_json(r.kase);  // items() does not keep a temporary alive
    for (const auto& item : id.items())
      if (item.key() != "plan_index" && std::find(keys.begin(), keys.end(), item.key()) == keys.end())
        keys.push_back(item.key());
  }
  return keys;
}

nlohmann::json to_json(const RunDocument& doc) {
  nlohmann::json results = nlohmann::json::array();
  for (const CaseRecord& r : doc.results) results.push_back(to_json(r));
  nlohmann::json j = {
      {"schema_version", kSchemaVersion},
      {"tool", "lattnbench"},
      {"version", doc.version},
      {"created_utc", doc.created_utc},
      {"argv", doc.argv},
      {"config", doc.config},
      {"device", to_json(doc.device)},
      {"identity_keys", identity_keys_json(doc.results)},
      {"results", results},
      {"totals", {{"cases", doc.totals.cases}, {"ok", doc.totals.ok}, {"failed", doc.totals.failed},
                  {"skipped", doc.totals.skipped}, {"unchecked", doc.totals.unchecked}}},
      {"summary", to_json(build_summary(doc.results))},
      {"warnings", doc.warnings},
  };
  if (!doc.filter.empty()) {
    j["filter"] = doc.filter;
    j["totals"]["not_planned"] = doc.totals.not_planned;
  }
  if (doc.shard) j["shard"] = {{"index", doc.shard->first}, {"count", doc.shard->second}};
  if (!doc.interrupted_by.empty()) {
    j["interrupted"] = true;
    j["interrupted_by"] = doc.interrupted_by;
  }
  return j;
}

namespace {

// Reads `key` of a journal line as T, or throws naming the line and the key.
template <class T>
T field(const nlohmann::json& line, const char* key, const std::string& where) {
  if (!line.contains(key)) throw UsageError(where, std::string("the journal record has no '") + key + "'");
  try {
    return line.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(where, std::string("the journal record's '") + key + "' is not a " +
                                (std::is_same_v<T, std::string> ? "string" : "value of its kind"));
  }
}

template <class T>
std::optional<T> optional_field(const nlohmann::json& line, const char* key, const std::string& where) {
  if (!line.contains(key)) return std::nullopt;
  return field<T>(line, key, where);
}

}  // namespace

CaseRecord record_from_json(const nlohmann::json& line, const Case& planned, const std::string& where) {
  if (!line.is_object()) throw UsageError(where, "the journal record is not a JSON object");
  const nlohmann::json identity = identity_json(planned);
  for (const auto& [key, value] : identity.items())
    if (!line.contains(key) || line[key] != value)
      throw UsageError(where, "the journal record's '" + key + "' does not match case " +
                                  std::to_string(planned.plan_index) + " of this run's plan");
  CaseRecord r;
  r.kase = planned;
  const std::string status = field<std::string>(line, "status", where);
  if (status == "ok") r.status = Status::ok;
  else if (status == "failed") r.status = Status::failed;
  else if (status == "skipped") r.status = Status::skipped;
  else if (status == "unchecked") r.status = Status::unchecked;
  else throw UsageError(where, "the journal record's status '" + status + "' is not ok, failed, skipped or unchecked");
  r.skip_reason = optional_field<std::string>(line, "skip_reason", where).value_or("");
  r.error = optional_field<std::string>(line, "error", where).value_or("");
  if (r.status == Status::skipped && r.skip_reason.empty())
    throw UsageError(where, "the journal record is skipped without a skip_reason");
  if (!line.contains("median_ms")) {
    if (r.status == Status::ok || r.status == Status::unchecked)
      throw UsageError(where, "the journal record is " + status + " but has no measurement");
    if (r.status == Status::failed && r.error.empty())
      throw UsageError(where, "the journal record failed without an error or a measurement");
    return r;
  }
  Measurement m;
  for (const DoubleKey& k : kDoubles)
    if (!(k.member == &Measurement::temp_mb && line.contains("temp_mb_unknown") && line["temp_mb"].is_null()))
      m.*k.member = field<double>(line, k.key, where);
  for (const IntKey& k : kInts) m.*k.member = field<int>(line, k.key, where);
  for (const OptionalKey& k : kOptionals) m.*k.member = optional_field<double>(line, k.key, where);
  for (const TextKey& k : kTexts) m.*k.member = optional_field<std::string>(line, k.key, where).value_or("");
  m.samples_ms = field<std::vector<double>>(line, "samples_ms", where);
  m.samples_cpu_ms = optional_field<std::vector<double>>(line, "samples_cpu_ms", where).value_or(std::vector<double>{});
  if (!m.samples_cpu_ms.empty() && m.samples_cpu_ms.size() != m.samples_ms.size())
    throw UsageError(where, "the journal record has " + std::to_string(m.samples_cpu_ms.size()) +
                                " samples_cpu_ms for " + std::to_string(m.samples_ms.size()) + " samples_ms");
  m.tile_counts = optional_field<std::map<std::string, std::uint64_t>>(line, "tile_counts", where)
                      .value_or(std::map<std::string, std::uint64_t>{});
  if ((r.status == Status::unchecked) != !m.unchecked.empty())
    throw UsageError(where, "the journal record's status and unchecked_reason disagree");
  if (r.status != Status::unchecked) {
    if (!line.contains("rel_err") || !line.contains("rel_errs") || !line["rel_errs"].is_object())
      throw UsageError(where, "the journal record has no rel_err and rel_errs");
    m.rel_err = error_from(line["rel_err"], where);
    for (const auto& [name, e] : line["rel_errs"].items()) m.rel_errs[name] = error_from(e, where);
    std::set<std::string> outputs, recorded;
    for (const TensorSpec& spec : planned.op->tensors)
      if (!is_input(spec.role) && spec.in(planned)) outputs.insert(spec.name);
    for (const auto& [name, e] : m.rel_errs) recorded.insert(name);
    if (recorded != outputs) throw UsageError(where, "the journal record's rel_errs do not name this case's outputs");
  }
  if (m.stopped_on != "samples" && m.stopped_on != "noise" && m.stopped_on != "timeout" && m.stopped_on != "interrupted")
    throw UsageError(where, "the journal record's stopped_on '" + m.stopped_on +
                                "' is not samples, noise, timeout or interrupted");
  m.above_ceiling = optional_field<bool>(line, "above_ceiling", where).value_or(false);
  m.above_roof = optional_field<bool>(line, "above_roof", where).value_or(false);
  m.checked_pairs = optional_field<int>(line, "checked_pairs", where).value_or(0);
  if (int(m.samples_ms.size()) != m.reps)
    throw UsageError(where, "the journal record has " + std::to_string(m.samples_ms.size()) + " samples for reps " +
                                std::to_string(m.reps));
  if (r.status == Status::failed && m.check_failure.empty() && r.error.empty())
    throw UsageError(where, "the journal record failed without a check_failure or an error");
  r.measured = std::move(m);
  return r;
}

}  // namespace lattn
