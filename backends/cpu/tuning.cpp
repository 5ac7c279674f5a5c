// How a run decides the CPU kernels' plan (backends/cpu/tuning.hpp): the shipped table, the cache,
// the quick calibration and the decision between them; the exhaustive search is
// backends/cpu/tuning_search.cpp. Over 500 lines because the cache's reading and writing and the
// calibration it caches are one format, kept in one place so that they cannot drift apart.
#include "backends/cpu/tuning.hpp"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>

#include "kernels/cpu/packed_gemm.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "src/results/build_info.hpp"
#include "src/run/counting_allocator.hpp"

namespace lattn::cpu {
namespace {

using tuning::Knob;
using tuning::Setting;
using Clock = std::chrono::steady_clock;

// 2: the structural choices (chunked.products, layer.products) by name, and the exhaustive block.
constexpr int kCacheFormat = 2;

// The shipped table: microarchitectures whose setting was measured on a quiet host of that kind
// (docs/performance.md, "Tuning per CPU"). Models are ranges of the family's model numbers.
struct ShippedEntry {
  const char* name;
  const char* vendor;
  int family;
  std::vector<std::pair<int, int>> models;  // inclusive ranges
  Vec vec;
  Setting setting;
};

const std::vector<ShippedEntry>& shipped_table() {
  // Zen 4 (family 25 models 0x10-0x1f Genoa, 0x60-0x7f Raphael and Phoenix, 0xa0-0xaf Bergamo):
  // the kernels' defaults were chosen there (docs/performance.md's tables).
  static const std::vector<ShippedEntry> table = {
      {"zen4",
       "AuthenticAMD",
       25,
       {{0x10, 0x1f}, {0x60, 0x7f}, {0xa0, 0xaf}},
       Vec::avx512,
       tuning::defaults(Vec::avx512)},
  };
  return table;
}

struct Signature {
  std::string vendor;
  int family = -1, model = -1;
};

std::optional<Signature> parse_signature(const std::string& text) {
  static const std::regex form(R"(^(\S+) family (\d+) model (\d+)( stepping \d+)?$)");
  std::smatch m;
  if (!std::regex_match(text, m, form)) return std::nullopt;
  return Signature{m[1], std::atoi(m[2].str().c_str()), std::atoi(m[3].str().c_str())};
}

// A file name of the signature: letters, digits and '-' ("AuthenticAMD-family-26-model-2-stepping-0").
std::string signature_slug(const std::string& signature) {
  std::string out;
  for (char c : signature) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  return out;
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buffer;
}

// A value as the cache writes it: a structural choice's name, else its number.
nlohmann::json value_json(Knob k, int value) {
  const char* label = tuning::value_label(k, value);
  return label ? nlohmann::json(label) : nlohmann::json(value);
}

nlohmann::json choices_json(const Setting& setting) {
  nlohmann::json j = nlohmann::json::object();
  for (Knob k : tuning::kAllKnobs) j[tuning::kernel_of(k)][tuning::name_of(k)] = value_json(k, setting[k]);
  return j;
}

TuningInfo::Choice choice_of(Knob k, int value) {
  const char* label = tuning::value_label(k, value);
  return {tuning::kernel_of(k), tuning::name_of(k), value, label ? label : ""};
}

nlohmann::json groups_json(const std::vector<TuningInfo::PlanGap>& groups) {
  nlohmann::json out = nlohmann::json::array();
  for (const TuningInfo::PlanGap& g : groups) {
    nlohmann::json best = nlohmann::json::object();
    for (const TuningInfo::Choice& c : g.best)
      best[c.kernel][c.name] = c.label.empty() ? nlohmann::json(c.value) : nlohmann::json(c.label);
    out.push_back({{"kernel", g.kernel},
                   {"combinations", g.combinations},
                   {"quick_ms", g.quick_ms},
                   {"best_ms", g.best_ms},
                   {"best", best}});
  }
  return out;
}

// The exhaustive block as written; a group that does not read back is left out (the block is a
// report, the plan is `choices`).
std::vector<TuningInfo::PlanGap> groups_from(const nlohmann::json& j) {
  std::vector<TuningInfo::PlanGap> out;
  if (!j.is_array()) return out;
  for (const nlohmann::json& g : j) {
    if (!g.is_object() || !g.value("kernel", nlohmann::json()).is_string() ||
        !g.value("quick_ms", nlohmann::json()).is_number() || !g.value("best_ms", nlohmann::json()).is_number())
      continue;
    TuningInfo::PlanGap gap;
    gap.kernel = g["kernel"].get<std::string>();
    gap.combinations = g.value("combinations", 0);
    gap.quick_ms = g["quick_ms"].get<double>();
    gap.best_ms = g["best_ms"].get<double>();
    if (g.contains("best") && g["best"].is_object())
      for (Knob k : tuning::kAllKnobs) {
        const nlohmann::json& kernel = g["best"].value(tuning::kernel_of(k), nlohmann::json());
        if (!kernel.is_object() || !kernel.contains(tuning::name_of(k))) continue;
        const nlohmann::json& v = kernel[tuning::name_of(k)];
        const int value = v.is_number_integer() ? v.get<int>() : v.is_string() ? tuning::value_from_label(k, v) : -1;
        if (value >= 0) gap.best.push_back(choice_of(k, value));
      }
    out.push_back(gap);
  }
  return out;
}

// The calibration's work: one kernel call at the setting in force, timed as the best of calls
// within a short window.
double best_call_seconds(const std::function<void()>& call, double window_s) {
  call();  // warm: caches, pages, the first call's allocations
  double best = 1e30;
  const auto start = Clock::now();
  for (int calls = 0; calls < 3 || std::chrono::duration<double>(Clock::now() - start).count() < window_s; ++calls) {
    const auto t0 = Clock::now();
    call();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    if (calls > 1000) break;
  }
  return best;
}

struct Bench {
  std::vector<Knob> knobs;     // the kernel's choices
  std::function<void()> call;  // one call of the kernel at the setting in force
};

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> out(n);
  for (float& x : out) x = uniform(rng);
  return out;
}

}  // namespace

const std::vector<std::string>& tuning_mode_names() {
  static const std::vector<std::string> names = {"auto", "shipped", "default", "calibrate", "exhaustive"};
  return names;
}

std::optional<TuningMode> tuning_mode_from(const std::string& name) {
  if (name == "auto") return TuningMode::automatic;
  if (name == "shipped") return TuningMode::shipped;
  if (name == "default") return TuningMode::defaults;
  if (name == "calibrate") return TuningMode::calibrate;
  if (name == "exhaustive") return TuningMode::exhaustive;
  return std::nullopt;
}

std::optional<ShippedTuning> shipped_tuning(const std::string& signature, Vec vec) {
  const std::optional<Signature> s = parse_signature(signature);
  if (!s) return std::nullopt;
  for (const ShippedEntry& e : shipped_table()) {
    if (e.vec != vec || s->vendor != e.vendor || s->family != e.family) continue;
    for (const auto& [lo, hi] : e.models)
      if (s->model >= lo && s->model <= hi) return ShippedTuning{e.name, e.setting};
  }
  return std::nullopt;
}

std::string tuning_cache_path(const std::string& signature) {
  if (signature.empty()) return "";
  std::filesystem::path base;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg)
    base = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home)
    base = std::filesystem::path(home) / ".cache";
  else
    return "";
  return (base / "lattnbench" / ("tuning-" + signature_slug(signature) + ".json")).string();
}

CachedTuning read_tuning_cache(const std::string& path, const std::string& signature, Vec vec) {
  CachedTuning out;
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return out;
  std::ifstream in(path);
  if (!in) {
    out.problem = "cannot be read";
    return out;
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    out.problem = "is not JSON";
    return out;
  }
  auto text = [&](const char* key) {
    return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  if (!j.is_object() || !j.contains("lattnbench_tuning") || j["lattnbench_tuning"] != kCacheFormat) {
    out.problem = fmt::format("is not a lattnbench tuning cache of format {}", kCacheFormat);
    return out;
  }
  if (text("cpu_signature") != signature) {
    out.problem = fmt::format("is for cpu_signature '{}', not '{}'", text("cpu_signature"), signature);
    return out;
  }
  if (text("vector_width") != to_string(vec)) {
    out.problem = fmt::format("is for vector width '{}', not {}", text("vector_width"), to_string(vec));
    return out;
  }
  if (!j.contains("choices") || !j["choices"].is_object()) {
    out.problem = "has no choices";
    return out;
  }
  Setting setting;
  for (Knob k : tuning::kAllKnobs) {
    const nlohmann::json& kernel = j["choices"].value(tuning::kernel_of(k), nlohmann::json());
    const char* name = tuning::name_of(k);
    const bool named = tuning::value_label(k, tuning::default_value(k, vec)) != nullptr;
    if (named) {
      const int value = kernel.is_object() && kernel.contains(name) && kernel[name].is_string()
                            ? tuning::value_from_label(k, kernel[name].get<std::string>())
                            : -1;
      if (value < 0) {
        out.problem = fmt::format("has no named choices.{}.{} (packed or {})", tuning::kernel_of(k), name,
                                  tuning::value_label(k, tuning::kProductsBlas));
        return out;
      }
      setting[k] = value;
      continue;
    }
    if (!kernel.is_object() || !kernel.contains(name) || !kernel[name].is_number_integer()) {
      out.problem = fmt::format("has no integer choices.{}.{}", tuning::kernel_of(k), name);
      return out;
    }
    setting[k] = kernel[name].get<int>();
  }
  if (const std::string why = tuning::invalid(setting, vec); !why.empty()) {
    out.problem = "holds " + why;
    return out;
  }
  out.setting = setting;
  if (j.contains("calibration_s") && j["calibration_s"].is_number())
    out.calibration_s = j["calibration_s"].get<double>();
  if (j.contains("exhaustive")) out.exhaustive = groups_from(j["exhaustive"]);
  if (j.contains("exhaustive_s") && j["exhaustive_s"].is_number()) out.exhaustive_s = j["exhaustive_s"].get<double>();
  return out;
}

std::string write_tuning_cache(const std::string& path, const std::string& signature, Vec vec,
                               const Calibration& calibration, const ExhaustiveSearch* search) {
  nlohmann::json trials = nlohmann::json::array();
  for (const Calibration::Trial& t : calibration.trials)
    trials.push_back({{"kernel", tuning::kernel_of(t.knob)},
                      {"choice", tuning::name_of(t.knob)},
                      {"incumbent", value_json(t.knob, t.incumbent)},
                      {"candidate", value_json(t.knob, t.candidate)},
                      {"incumbent_ms", t.incumbent_s * 1e3},
                      {"candidate_ms", t.candidate_s * 1e3},
                      {"wins", t.wins},
                      {"rounds", t.rounds},
                      {"kept", t.kept}});
  nlohmann::json j = {{"lattnbench_tuning", kCacheFormat},
                      {"cpu_signature", signature},
                      {"vector_width", to_string(vec)},
                      {"created_utc", utc_now()},
                      {"lattnbench_version", kVersion},
                      {"calibration_s", calibration.seconds},
                      {"choices", choices_json(search ? search->setting : calibration.setting)},
                      {"trials", trials}};
  if (search) {
    j["quick_choices"] = choices_json(calibration.setting);
    j["exhaustive"] = groups_json(search->groups);
    j["exhaustive_s"] = search->seconds;
  }
  std::error_code ec;
  const std::filesystem::path target(path);
  std::filesystem::create_directories(target.parent_path(), ec);
  if (ec) return fmt::format("cannot create {}: {}", target.parent_path().string(), ec.message());
  // Beside the target, then renamed: two runs calibrating at once leave one whole file.
  const std::string temporary = path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary);
    out << j.dump(2) << "\n";
    out.close();
    if (!out) {
      std::filesystem::remove(temporary, ec);
      return fmt::format("cannot write {}", temporary);
    }
  }
  std::filesystem::rename(temporary, target, ec);
  if (ec) {
    std::filesystem::remove(temporary, ec);
    return fmt::format("cannot rename onto {}", path);
  }
  return "";
}

Calibration calibrate_tuning(Vec vec, double budget_s) {
  const auto start = Clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // the choices are a core's: registers, L1 and L2
  const Setting saved = tuning::current(vec);
  CountingAllocator allocator;
  std::mt19937 rng(7);

  // The scan forward at D 64 over 960 tokens and at D 128 over 480 (multiples of every
  // tokens_per_walk candidate): the walk's shape matters most at the smaller D, where the loads and
  // stores of a row weigh more against its FMAs; the same tokens serve both.
  Problem scan_problem, scan_small;
  scan_problem.seq = 480;
  scan_problem.dim = 128;
  scan_small.seq = 960;
  scan_small.dim = 64;
  const std::size_t tokens = std::size_t(scan_problem.seq) * scan_problem.dim;
  const std::vector<float> q = random_floats(tokens, rng, 1.0f), k = random_floats(tokens, rng, 1.0f),
                           v = random_floats(tokens, rng, 1.0f), h0(std::size_t(128) * 128, 0.0f);
  std::vector<float> o(tokens), hT(std::size_t(128) * 128);
  const ForwardArgs<float> scan_args{q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data()};

  // A layer-sized product: 336 x 512 rows of x against a 512 x 256 weight.
  const int m = 336, n = 256, depth = 512;
  const std::vector<float> a = random_floats(std::size_t(m) * depth, rng, 1.0f),
                           b = random_floats(std::size_t(depth) * n, rng, 1.0f);
  std::vector<float> c(std::size_t(m) * n);

  // The chunked forward (tile products) at D 128, chunk 128, over 8 chunks.
  Problem chunked_problem = scan_problem;
  chunked_problem.seq = 1024;
  chunked_problem.chunk = 128;
  const std::size_t chunked_tokens = std::size_t(chunked_problem.seq) * chunked_problem.dim;
  const std::vector<float> cq = random_floats(chunked_tokens, rng, 1.0f), ck = random_floats(chunked_tokens, rng, 1.0f),
                           cv = random_floats(chunked_tokens, rng, 1.0f);
  std::vector<float> co(chunked_tokens), chT(std::size_t(128) * 128);
  const ForwardArgs<float> chunked_args{cq.data(), ck.data(), cv.data(), h0.data(), co.data(), chT.data()};

  const std::vector<Bench> benches = {
      {{Knob::scan_tokens_per_walk, Knob::scan_column_block, Knob::scan_prefetch_rows},
       [&] {
         scan_forward(scan_small, scan_args, allocator);
         scan_forward(scan_problem, scan_args, allocator);
       }},
      {{Knob::gemm_micro_rows, Knob::gemm_depth_block, Knob::gemm_row_tiles},
       [&] {
         gemm::parallel_multiply(false, false, m, n, depth, a.data(), depth, b.data(), n, 0.0f, c.data(), n, allocator);
       }},
      // Structure: the layer's products on the packed kernels as just tuned, or on OpenBLAS.
      {{Knob::layer_products},
       [&] { layer_product(false, m, n, depth, a.data(), depth, b.data(), n, 0.0f, c.data(), n, allocator); }},
      // Structure, then a constant: the chunked products on the tiles or on OpenBLAS, then where the
      // tiles prefetch.
      {{Knob::chunked_products, Knob::tile_prefetch_next},
       [&] { chunked_forward(chunked_problem, chunked_args, allocator); }},
  };

  Setting best = tuning::defaults(vec);
  std::vector<Calibration::Trial> trials;
  const double window_s = 0.006;
  constexpr int kRounds = 5;
  for (const Bench& bench : benches)
    for (Knob knob : bench.knobs)
      for (int candidate : tuning::candidates(knob, vec)) {
        if (candidate == best[knob] || elapsed() > budget_s) continue;
        Setting trial = best;
        trial[knob] = candidate;
        // Rounds of the two in turn (which goes first alternating): a busy moment meets both alike.
        // The trial must win by 3% on the best of all rounds and win all rounds but one, so that a
        // busy stretch on one side alone cannot make the choice.
        double incumbent_s = 1e30, trial_s = 1e30;
        int wins = 0;
        for (int round = 0; round < kRounds; ++round) {
          double round_s[2];
          for (int side = 0; side < 2; ++side) {
            const bool trial_side = (side == 1) == (round % 2 == 0);
            tuning::set(vec, trial_side ? trial : best);
            round_s[trial_side] = best_call_seconds(bench.call, window_s);
          }
          incumbent_s = std::min(incumbent_s, round_s[0]);
          trial_s = std::min(trial_s, round_s[1]);
          wins += round_s[1] < round_s[0];
        }
        const bool kept = trial_s < 0.97 * incumbent_s && wins >= kRounds - 1;
        trials.push_back({knob, best[knob], candidate, incumbent_s, trial_s, wins, kRounds, kept});
        if (kept) best = trial;
      }
  tuning::set(vec, saved);
  omp_set_num_threads(threads);
  return {best, elapsed(), trials};
}

TuningInfo tuning_info(const std::string& source, Vec vec, const Setting& setting) {
  TuningInfo info;
  info.source = source;
  info.vector_width = to_string(vec);
  for (Knob k : tuning::kAllKnobs) info.choices.push_back(choice_of(k, setting[k]));
  return info;
}

TuningInfo decide_tuning(TuningMode mode, const std::string& signature, Vec vec, const std::string& cache_path,
                         const Calibrator& calibrate, const Searcher& search) {
  if (mode == TuningMode::defaults) return tuning_info("default", vec, tuning::defaults(vec));
  const std::optional<ShippedTuning> shipped = shipped_tuning(signature, vec);
  auto from_table = [&] {
    if (!shipped) return tuning_info("default", vec, tuning::defaults(vec));
    TuningInfo info = tuning_info("shipped", vec, shipped->setting);
    info.microarchitecture = shipped->microarchitecture;
    return info;
  };
  if (mode == TuningMode::shipped) return from_table();
  // auto and calibrate: every knob with one candidate at this width (the portable one) has nothing
  // to calibrate.
  bool choices = false;
  for (Knob k : tuning::kAllKnobs) choices = choices || tuning::candidates(k, vec).size() > 1;
  if (!choices) return from_table();

  std::optional<std::string> note;
  if (mode == TuningMode::automatic) {
    const CachedTuning cached = read_tuning_cache(cache_path, signature, vec);
    if (cached.setting) {
      TuningInfo info = tuning_info("cached", vec, *cached.setting);
      info.cache = cache_path;
      info.calibration_s = cached.calibration_s;
      info.exhaustive = cached.exhaustive;
      info.exhaustive_s = cached.exhaustive_s;
      return info;
    }
    if (!cached.problem.empty())
      note = fmt::format("tuning cache {} {}: calibrated again", cache_path, cached.problem);
    else if (shipped)
      return from_table();
  }
  const Calibration calibration = calibrate(vec);
  std::optional<ExhaustiveSearch> searched;
  if (mode == TuningMode::exhaustive)
    searched = search ? search(vec, calibration.setting) : search_tuning(vec, calibration.setting);
  TuningInfo info = searched ? tuning_info("exhaustive", vec, searched->setting)
                             : tuning_info("calibrated", vec, calibration.setting);
  info.calibration_s = calibration.seconds;
  if (searched) {
    info.exhaustive = searched->groups;
    info.exhaustive_s = searched->seconds;
  }
  if (cache_path.empty()) {
    note = "no cache folder ($XDG_CACHE_HOME and $HOME unset, or no cpu_signature): the calibration is not kept";
  } else if (const std::string why =
                 write_tuning_cache(cache_path, signature, vec, calibration, searched ? &*searched : nullptr);
             !why.empty()) {
    note = (note ? *note + "; " : std::string()) + "the calibration is not kept: " + why;
  } else {
    info.cache = cache_path;
  }
  info.note = note;
  return info;
}

const TuningInfo& apply_tuning(TuningMode mode) {
  static std::once_flag once;
  static TuningInfo decided;
  std::call_once(once, [mode] {
    const Vec vec = active_vec();
    const std::string signature = cpu_signature();
    decided = decide_tuning(mode, signature, vec, tuning_cache_path(signature),
                            [](Vec v) { return calibrate_tuning(v); });
    Setting setting = tuning::current(vec);
    for (Knob k : tuning::kAllKnobs)
      for (const TuningInfo::Choice& c : decided.choices)
        if (c.kernel == tuning::kernel_of(k) && c.name == tuning::name_of(k)) setting[k] = c.value;
    tuning::set(vec, setting);
    if (decided.note) fmt::print(stderr, "lattnbench: warning: {}\n", *decided.note);
    if (decided.source == "calibrated" || decided.source == "exhaustive")
      fmt::print(stderr, "lattnbench: tuned the CPU kernels for {} in {:.1f} s{} (--tuning default skips this)\n",
                 signature.empty() ? "this CPU" : signature,
                 decided.calibration_s.value_or(0.0) + decided.exhaustive_s.value_or(0.0),
                 decided.cache ? ", cached in " + *decided.cache : std::string());
    if (decided.source == "exhaustive") {
      for (const TuningInfo::PlanGap& g : decided.exhaustive) {
        std::string best;
        for (const TuningInfo::Choice& c : g.best)
          best += fmt::format("{}{}.{} {}", best.empty() ? "" : ", ", c.kernel, c.name,
                              c.label.empty() ? std::to_string(c.value) : c.label);
        fmt::print(stderr,
                   "lattnbench: exhaustive {}: the quick plan {:.1f} ms, the best of {} combinations {:.1f} ms "
                   "(quick / best {:.3f}: {})\n",
                   g.kernel, g.quick_ms, g.combinations, g.best_ms, g.best_ms > 0 ? g.quick_ms / g.best_ms : 0.0, best);
      }
      if (decided.exhaustive.empty())
        fmt::print(stderr, "lattnbench: exhaustive: no group of choices has more than one combination at {}\n",
                   to_string(vec));
    }
  });
  return decided;
}

}  // namespace lattn::cpu
