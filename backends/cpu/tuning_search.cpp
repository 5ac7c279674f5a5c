// The exhaustive plan search of backends/cpu/tuning.hpp (--tuning exhaustive): every combination
// of each group of the CPU kernels' choices timed on the suites' own shapes, from the quick
// calibration's plan (backends/cpu/tuning.cpp), to say how far that plan is from the best and to
// run the best. Tested in tests/kernels/test_tuning.cpp.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "backends/cpu/tuning.hpp"
#include "kernels/layer/cpu/products.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "src/run/counting_allocator.hpp"

namespace lattn::cpu {
namespace {

using tuning::Knob;
using tuning::Setting;
using Clock = std::chrono::steady_clock;

std::vector<float> random_floats(std::size_t n, std::mt19937& rng, float scale) {
  std::uniform_real_distribution<float> uniform(-scale, scale);
  std::vector<float> out(n);
  for (float& x : out) x = uniform(rng);
  return out;
}

TuningInfo::Choice choice_of(Knob k, int value) {
  const char* label = tuning::value_label(k, value);
  return {tuning::kernel_of(k), tuning::name_of(k), value, label ? label : ""};
}

// One problem of the kernel suite with every tensor its forward and backward take: log-gates <= 0
// for a gated decay, write strengths in (0, 1) and unit-norm keys for the delta rule (so that the
// state stays bounded over the suite's 8192 tokens and no call runs into subnormals or infinities).
struct SuiteProblem {
  Problem p;
  std::vector<float> q, k, v, h0, o, hT, g, beta, dO, dhT, dq, dk, dv, dh0, dg, dbeta, kept;

  SuiteProblem(Rule rule, Decay decay, int dim, int seq, std::mt19937& rng) {
    p.batch = 2;
    p.heads = 4;
    p.seq = seq;
    p.dim = dim;
    p.chunk = 128;
    p.rule = rule;
    p.decay = decay;
    const float scale = 1.0f / std::sqrt(float(dim));
    q = random_floats(p.key_elems(), rng, scale);
    k = random_floats(p.key_elems(), rng, scale);
    v = random_floats(p.value_elems(), rng, 1.0f);
    dO = random_floats(p.value_elems(), rng, 1.0f);
    if (p.delta())
      for (std::size_t row = 0; row < p.key_elems() / dim; ++row) {
        float* r = k.data() + row * dim;
        float norm = 0.0f;
        for (int d = 0; d < dim; ++d) norm += r[d] * r[d];
        for (int d = 0; d < dim; ++d) r[d] /= std::sqrt(norm) + 1e-6f;
      }
    h0.assign(p.state_elems(), 0.0f);
    dhT = random_floats(p.state_elems(), rng, 1.0f);
    o.resize(p.value_elems());
    hT.resize(p.state_elems());
    dq.resize(p.key_elems());
    dk.resize(p.key_elems());
    dv.resize(p.value_elems());
    dh0.resize(p.state_elems());
    if (gated(decay)) {
      g = random_floats(p.gate_elems(), rng, 0.05f);
      for (float& x : g) x = -std::abs(x);
      dg.resize(p.gate_elems());
    }
    if (p.delta()) {
      std::uniform_real_distribution<float> uniform(0.1f, 0.9f);
      beta.resize(p.beta_elems());
      for (float& x : beta) x = uniform(rng);
      dbeta.resize(p.beta_elems());
    }
  }
  const float* or_null(const std::vector<float>& x) const { return x.empty() ? nullptr : x.data(); }
  float* or_null(std::vector<float>& x) { return x.empty() ? nullptr : x.data(); }
  ForwardArgs<float> forward() {
    return {q.data(), k.data(), v.data(), h0.data(), o.data(), hT.data(), or_null(g), or_null(beta)};
  }
  BackwardArgs<float> backward() {
    return {q.data(),  k.data(),  v.data(),  h0.data(),  dO.data(),  dhT.data(), dq.data(),
            dk.data(), dv.data(), dh0.data(), or_null(g), or_null(dg), or_null(beta), or_null(dbeta)};
  }
};

// Every combination of `knobs`' candidates at vec, the other choices as `base`; `base` itself
// first.
std::vector<Setting> combinations(const std::vector<Knob>& knobs, Vec vec, const Setting& base) {
  std::vector<Setting> out = {base};
  for (Knob k : knobs) {
    std::vector<Setting> next;
    for (const Setting& s : out)
      for (int c : tuning::candidates(k, vec)) {
        Setting t = s;
        t[k] = c;
        if (std::find(next.begin(), next.end(), t) == next.end()) next.push_back(t);
      }
    out = next;
  }
  std::stable_partition(out.begin(), out.end(), [&](const Setting& s) { return s == base; });
  return out;
}

// Best of two calls after one to warm.
double best_of_two(const std::function<void()>& call) {
  call();
  double best = 1e30;
  for (int i = 0; i < 2; ++i) {
    const auto t0 = Clock::now();
    call();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

ExhaustiveSearch search_tuning(Vec vec, const Setting& quick, int kernel_seq, int layer_seq) {
  const auto start = Clock::now();
  const Setting saved = tuning::current(vec);
  CountingAllocator allocator;
  std::mt19937 rng(11);
  ExhaustiveSearch out;
  out.setting = quick;

  // A group: its choices, and its shapes as calls (each made anew per shape so that one shape's
  // tensors are alive at a time), each call run at the setting in force.
  struct Group {
    const char* name;
    std::vector<Knob> knobs;
    // Whether a combination is worth timing: the packed products' constants only matter where the
    // layer runs them.
    std::function<bool(const Setting&)> wanted;
    std::function<void(const std::function<void(const std::function<void()>&)>&)> shapes;
  };
  auto kernel_suite = [&](const std::vector<std::pair<Rule, Decay>>& cases, bool chunked) {
    return [&rng, &allocator, cases, chunked, kernel_seq](const std::function<void(const std::function<void()>&)>& time) {
      for (const auto& [rule, decay] : cases)
        for (int dim : {64, 128}) {
          SuiteProblem sp(rule, decay, dim, kernel_seq, rng);
          if (chunked)
            time([&] {
              sp.kept.resize(chunked_kept_states_bytes(sp.p) / sizeof(float));
              float* kept = sp.kept.empty() ? nullptr : sp.kept.data();
              chunked_forward(sp.p, sp.forward(), allocator, kept);
              chunked_backward(sp.p, sp.backward(), allocator, kept);
            });
          else
            time([&] {
              scan_forward(sp.p, sp.forward(), allocator);
              scan_backward(sp.p, sp.backward(), allocator);
            });
        }
    };
  };
  const std::vector<Group> groups = {
      {"scan",
       {Knob::scan_tokens_per_walk, Knob::scan_column_block, Knob::scan_prefetch_rows},
       nullptr,
       kernel_suite({{Rule::additive, Decay::none}, {Rule::additive, Decay::scalar}, {Rule::additive, Decay::vector}},
                    false)},
      {"layer",
       {Knob::gemm_micro_rows, Knob::gemm_depth_block, Knob::gemm_row_tiles, Knob::layer_products},
       [&quick](const Setting& s) {
         if (s[Knob::layer_products] == tuning::kProductsPacked) return true;
         return s[Knob::gemm_micro_rows] == quick[Knob::gemm_micro_rows] &&
                s[Knob::gemm_depth_block] == quick[Knob::gemm_depth_block] &&
                s[Knob::gemm_row_tiles] == quick[Knob::gemm_row_tiles];
       },
       [&rng, &allocator, layer_seq](const std::function<void(const std::function<void()>&)>& time) {
         // The layer suite's projections at B 2, T 2048, model width 512: Q, K and V together, the
         // output projection, and the backward's product against a weight's transpose.
         const int rows = 2 * layer_seq, width = 512;
         const std::vector<float> x = random_floats(std::size_t(rows) * 3 * width, rng, 1.0f),
                                  w = random_floats(std::size_t(3 * width) * 3 * width, rng, 0.05f);
         std::vector<float> y(std::size_t(rows) * 3 * width);
         time([&] {
           layer_product(false, rows, 3 * width, width, x.data(), width, w.data(), 3 * width, 0.0f, y.data(),
                         3 * width, allocator);
           layer_product(false, rows, width, width, x.data(), width, w.data(), width, 0.0f, y.data(), width,
                         allocator);
           layer_product(true, rows, width, 3 * width, x.data(), 3 * width, w.data(), 3 * width, 0.0f, y.data(),
                         width, allocator);
         });
       }},
      {"chunked",
       {Knob::chunked_products, Knob::tile_prefetch_next},
       nullptr,
       kernel_suite({{Rule::additive, Decay::none}, {Rule::additive, Decay::vector}, {Rule::delta, Decay::scalar}},
                    true)},
  };

  for (const Group& group : groups) {
    std::vector<Setting> combos = combinations(group.knobs, vec, quick);
    if (group.wanted)
      combos.erase(std::remove_if(combos.begin(), combos.end(), [&](const Setting& s) { return !group.wanted(s); }),
                   combos.end());
    if (combos.size() < 2) continue;
    // Shapes outer, combinations inner: one shape's tensors at a time, every combination on them.
    std::vector<double> seconds(combos.size(), 0.0);
    group.shapes([&](const std::function<void()>& call) {
      for (std::size_t i = 0; i < combos.size(); ++i) {
        tuning::set(vec, combos[i]);
        seconds[i] += best_of_two(call);
      }
    });
    const std::size_t best = std::size_t(std::min_element(seconds.begin(), seconds.end()) - seconds.begin());
    TuningInfo::PlanGap gap;
    gap.kernel = group.name;
    gap.combinations = int(combos.size());
    gap.quick_ms = seconds[0] * 1e3;  // combos[0] is the quick plan
    gap.best_ms = seconds[best] * 1e3;
    for (Knob k : group.knobs) {
      gap.best.push_back(choice_of(k, combos[best][k]));
      out.setting[k] = combos[best][k];
    }
    out.groups.push_back(gap);
  }
  tuning::set(vec, saved);
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

}  // namespace lattn::cpu
