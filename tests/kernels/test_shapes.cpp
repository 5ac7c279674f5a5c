// The shapes of docs/spec.md section 1c (grouped q/k heads, Dk x Dv states, packed documents): the
// float64 reference held to its definition (a grouped, rectangular, packed problem is the square
// dense problem on expanded, zero-padded, per-document copies) and to central finite differences;
// every CPU impl row, rule and decay held to the reference on them, whichever variant runs it
// (native or through the gather adapter, kernels/linear_attention/cpu/shape_gather.cpp); their
// scratch closed forms held to the measured peak; the config keys and records.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/cpu/vec.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/variants.hpp"
#include "kernels/linear_attention/packing.hpp"
#include "kernels/linear_attention/reference.hpp"
#include "src/run/counting_allocator.hpp"
#include "cases.hpp"
#include "test_util.hpp"

using namespace lattn;
using Catch::Matchers::Contains;

namespace {

constexpr Decay kDecays[] = {Decay::none, Decay::retnet, Decay::scalar, Decay::vector};
constexpr Rule kRules[] = {Rule::additive, Rule::delta};

Problem shaped(int batch, int heads, int seq, int dim, int chunk, Decay decay, Rule rule, int heads_k, int dim_v,
               const std::vector<int>& lengths = {}) {
  Problem p{batch, heads, seq, dim, chunk, decay, rule};
  p.heads_k = heads_k == heads ? 0 : heads_k;
  p.dim_v = dim_v == dim ? 0 : dim_v;
  if (!lengths.empty()) {
    p.batch = 1;
    p.cu_seqlens = {0};
    for (int n : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + n);
    p.seq = p.cu_seqlens.back();
  }
  return p;
}

struct Tensors {
  std::vector<double> q, k, v, h0, dO, dhT, g, beta;
};

Tensors random_tensors(const Problem& p, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  const auto draw = [&](std::size_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = normal(rng);
    return v;
  };
  Tensors t{draw(p.key_elems()),   draw(p.key_elems()),   draw(p.value_elems()), draw(p.state_elems()),
            draw(p.value_elems()), draw(p.state_elems()), draw(p.gate_elems()),  draw(p.beta_elems())};
  for (double& z : t.g) z = -std::log1p(std::exp(-z)) / 4;  // strong gates: log-gates in about [-1, 0)
  for (double& z : t.beta) z = 1 / (1 + std::exp(-z));
  if (p.delta())  // unit keys, as the suite draws them for the delta rule
    for (std::size_t r = 0; r < t.k.size(); r += std::size_t(p.dim)) {
      double sum = 0;
      for (int i = 0; i < p.dim; ++i) sum += t.k[r + i] * t.k[r + i];
      for (int i = 0; i < p.dim; ++i) t.k[r + i] /= std::sqrt(sum);
    }
  return t;
}

struct Results {
  std::vector<double> o, hT, dq, dk, dv, dh0, dg, dbeta;
};

Results reference_of(const Problem& p, const Tensors& t) {
  Results r{std::vector<double>(p.value_elems()), std::vector<double>(p.state_elems()),
            std::vector<double>(p.key_elems()),   std::vector<double>(p.key_elems()),
            std::vector<double>(p.value_elems()), std::vector<double>(p.state_elems()),
            std::vector<double>(p.gate_elems()),  std::vector<double>(p.beta_elems())};
  const double* g = gated(p.decay) ? t.g.data() : nullptr;
  const double* beta = p.delta() ? t.beta.data() : nullptr;
  reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), r.o.data(), r.hT.data(), g, beta});
  reference::backward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), r.dq.data(),
                          r.dk.data(), r.dv.data(), r.dh0.data(), g, g ? r.dg.data() : nullptr, beta,
                          beta ? r.dbeta.data() : nullptr});
  return r;
}

double worst_gap(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return worst / scale;
}

}  // namespace

TEST_CASE("the reference on grouped, rectangular and packed shapes is the square one on expanded copies",
          "[shapes][reference]") {
  // Built here by hand, one (sequence, value head) pair at a time: each pair is a square dense
  // problem of one head (its own retnet gamma kept by giving it the head's index), q/k its q/k
  // head's rows padded with zero key channels to P = max(Dk, Dv) and q scaled so that the
  // square problem's 1/sqrt(P) is 1/sqrt(Dk); v, dO, h0 and dhT padded with zero columns.
  for (Rule rule : kRules)
    for (Decay decay : kDecays)
      for (const Problem& p : {shaped(2, 4, 6, 3, 64, decay, rule, 2, 5), shaped(1, 4, 0, 5, 64, decay, rule, 1, 2, {3, 1, 4}),
                               shaped(1, 2, 0, 4, 64, decay, rule, 2, 4, {2, 5})}) {
        INFO(test::describe(p));
        const Tensors t = random_tensors(p, 7);
        const Results r = reference_of(p, t);
        const int Dk = p.dim, Dv = p.value_dim(), P = std::max(Dk, Dv), W = p.gate_width();
        const double scale = std::sqrt(double(P) / Dk);
        Results expect{std::vector<double>(r.o.size()),  std::vector<double>(r.hT.size()),  std::vector<double>(r.dq.size()),
                       std::vector<double>(r.dk.size()), std::vector<double>(r.dv.size()),  std::vector<double>(r.dh0.size()),
                       std::vector<double>(r.dg.size()), std::vector<double>(r.dbeta.size())};
        for (std::size_t index = 0; index < p.slices(); ++index) {
          const HeadSlice h = p.slice(index);
          // A square problem of h.head + 1 heads whose last head is this pair (so retnet's gamma_h
          // is the pair's), the earlier heads zero.
          const Problem s{1, h.head + 1, h.seq, P, 64, p.decay, p.rule};
          Tensors u;
          u.q.assign(s.token_elems(), 0), u.k = u.q, u.v = u.q, u.dO = u.q;
          u.h0.assign(s.state_elems(), 0), u.dhT = u.h0;
          u.g.assign(s.gate_elems(), 0), u.beta.assign(s.beta_elems(), 0.5);
          const std::size_t tok = std::size_t(h.head) * s.head_token_elems(), st = std::size_t(h.head) * P * P;
          for (int n = 0; n < h.seq; ++n) {
            for (int i = 0; i < Dk; ++i) {
              u.q[tok + std::size_t(n) * P + i] = t.q[h.key + std::size_t(n) * Dk + i] * scale;
              u.k[tok + std::size_t(n) * P + i] = t.k[h.key + std::size_t(n) * Dk + i];
            }
            for (int j = 0; j < Dv; ++j) {
              u.v[tok + std::size_t(n) * P + j] = t.v[h.value + std::size_t(n) * Dv + j];
              u.dO[tok + std::size_t(n) * P + j] = t.dO[h.value + std::size_t(n) * Dv + j];
            }
            for (int i = 0; i < W; ++i) u.g[std::size_t(h.head) * s.head_gate_elems() + std::size_t(n) * (W > 1 ? P : 1) + i] =
                t.g[h.gate + std::size_t(n) * W + i];
            u.beta[std::size_t(h.head) * h.seq + n] = t.beta[h.beta + n];
          }
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) {
              u.h0[st + std::size_t(i) * P + j] = t.h0[h.state + std::size_t(i) * Dv + j];
              u.dhT[st + std::size_t(i) * P + j] = t.dhT[h.state + std::size_t(i) * Dv + j];
            }
          const Results w = reference_of(s, u);
          for (int n = 0; n < h.seq; ++n) {
            for (int j = 0; j < Dv; ++j) {
              expect.o[h.value + std::size_t(n) * Dv + j] = w.o[tok + std::size_t(n) * P + j];
              expect.dv[h.value + std::size_t(n) * Dv + j] = w.dv[tok + std::size_t(n) * P + j];
            }
            for (int i = 0; i < Dk; ++i) {  // shared q/k heads: the sum over the value heads
              expect.dq[h.key + std::size_t(n) * Dk + i] += w.dq[tok + std::size_t(n) * P + i] * scale;
              expect.dk[h.key + std::size_t(n) * Dk + i] += w.dk[tok + std::size_t(n) * P + i];
            }
            for (int i = 0; i < W; ++i)
              expect.dg[h.gate + std::size_t(n) * W + i] =
                  w.dg[std::size_t(h.head) * s.head_gate_elems() + std::size_t(n) * (W > 1 ? P : 1) + i];
            if (p.delta()) expect.dbeta[h.beta + n] = w.dbeta[std::size_t(h.head) * h.seq + n];
          }
          for (int i = 0; i < Dk; ++i)
            for (int j = 0; j < Dv; ++j) {
              expect.hT[h.state + std::size_t(i) * Dv + j] = w.hT[st + std::size_t(i) * P + j];
              expect.dh0[h.state + std::size_t(i) * Dv + j] = w.dh0[st + std::size_t(i) * P + j];
            }
        }
        CHECK(worst_gap(r.o, expect.o) < 1e-12);
        CHECK(worst_gap(r.hT, expect.hT) < 1e-12);
        CHECK(worst_gap(r.dq, expect.dq) < 1e-12);
        CHECK(worst_gap(r.dk, expect.dk) < 1e-12);
        CHECK(worst_gap(r.dv, expect.dv) < 1e-12);
        CHECK(worst_gap(r.dh0, expect.dh0) < 1e-12);
        if (gated(p.decay)) CHECK(worst_gap(r.dg, expect.dg) < 1e-12);
        if (p.delta()) CHECK(worst_gap(r.dbeta, expect.dbeta) < 1e-12);
      }
}

TEST_CASE("the reference's gradients on grouped, rectangular, packed shapes match central differences",
          "[shapes][reference][grad]") {
  for (Rule rule : kRules)
    for (Decay decay : kDecays) {
      const Problem p = shaped(1, 4, 0, 3, 64, decay, rule, 2, 4, {3, 1, 2});
      INFO(test::describe(p));
      Tensors t = random_tensors(p, 5);
      const Results r = reference_of(p, t);
      const auto loss = [&](const Tensors& x) {
        const Results y = reference_of(p, x);
        double l = 0;
        for (std::size_t i = 0; i < y.o.size(); ++i) l += y.o[i] * x.dO[i];
        for (std::size_t i = 0; i < y.hT.size(); ++i) l += y.hT[i] * x.dhT[i];
        return l;
      };
      const auto check = [&](std::vector<double> Tensors::*input, const std::vector<double>& grad, const char* name) {
        double worst = 0;
        for (std::size_t i = 0; i < grad.size(); ++i) {
          const double keep = (t.*input)[i], h = 1e-5;
          (t.*input)[i] = keep + h;
          const double up = loss(t);
          (t.*input)[i] = keep - h;
          const double down = loss(t);
          (t.*input)[i] = keep;
          worst = std::max(worst, std::abs((up - down) / (2 * h) - grad[i]) / (1 + std::abs(grad[i])));
        }
        INFO(name);
        CHECK(worst < 1e-6);
      };
      check(&Tensors::q, r.dq, "dq");
      check(&Tensors::k, r.dk, "dk");
      check(&Tensors::v, r.dv, "dv");
      check(&Tensors::h0, r.dh0, "dh0");
      if (gated(decay)) check(&Tensors::g, r.dg, "dg");
      if (rule == Rule::delta) check(&Tensors::beta, r.dbeta, "dbeta");
    }
}

namespace {

// The shapes every CPU row is held to: heads_k in {1, heads / 2, heads}, dim_v in {dim / 2, dim,
// 2 dim}, dense and packed (ragged lengths: one of length 1, none a chunk multiple).
std::vector<Problem> table_shapes(Decay decay, Rule rule) {
  return {shaped(2, 4, 37, 16, 16, decay, rule, 1, 8),  shaped(2, 4, 37, 16, 16, decay, rule, 2, 16),
          shaped(2, 4, 37, 16, 16, decay, rule, 4, 32), shaped(1, 4, 0, 16, 16, decay, rule, 2, 8, {19, 1, 8, 33}),
          shaped(1, 4, 0, 16, 8, decay, rule, 1, 32, {5, 17, 1}), shaped(1, 4, 0, 16, 16, decay, rule, 4, 16, {40, 3})};
}

// The shapes of table_shapes, RWKV-6's bonus form (docs/spec.md section 1g) of the additive rule's
// vector-gated ones, and DeltaProduct's 2 writes per token (section 1h) of the delta rule's with the
// decays it takes.
std::vector<Problem> table_shapes_with_bonus(Decay decay, Rule rule) {
  std::vector<Problem> shapes = table_shapes(decay, rule);
  const bool bonus = rule == Rule::additive && decay == Decay::vector;
  const bool product = rule == Rule::delta && decay != Decay::retnet;
  if (!bonus && !product) return shapes;
  for (std::size_t i = 0, n = shapes.size(); i < n; ++i) {
    Problem p = shapes[i];
    p.bonus = bonus;
    p.householder = product ? 2 : 1;
    shapes.push_back(p);
  }
  return shapes;
}

}  // namespace

TEST_CASE("every CPU impl row, rule and decay computes the grouped, rectangular and packed shapes",
          "[shapes][variants]") {
  for (const cpu::Vec vec : cpu::available_vecs()) {
    test::VecOverride force(vec);
    auto backend = make_backend("cpu", BackendOptions{2});
    for (const std::string impl : {"scan", "chunked"})
      for (Rule rule : kRules)
        for (Decay decay : kDecays)
          for (const Problem& p : table_shapes_with_bonus(decay, rule)) {
            const Case c = test::kernel_case(p, impl, Mode::fwd_bwd);
            INFO(cpu::to_string(vec) << " " << test::describe(c) << " via " << backend->variant(c));
            REQUIRE_FALSE(backend->unsupported(c));
            const CheckResult result = test::run_on(*backend, c).check;
            INFO(test::errors(result));
            CHECK(result.passed);
          }
  }
}

TEST_CASE("the scratch closed forms of every CPU variant equal the peak on the new shapes", "[shapes][memory]") {
  for (const std::string form : {"scan", "chunked"})
    for (Rule rule : kRules)
      for (Decay decay : kDecays)
        for (const Problem& p : table_shapes_with_bonus(decay, rule)) {
          const cpu::CpuVariant v = cpu::cpu_variant_for(form, p);
          INFO(form << " " << test::describe(p) << " via " << v.name);
          const TensorSet t = make_case_inputs(test::kernel_case(p, form, Mode::fwd_bwd), 0);
          const std::size_t writes = std::size_t(p.householder);  // k, v, beta rows per token
          std::vector<float> o(p.value_elems()), hT(p.state_elems()), dq(p.key_elems()), dk(p.key_elems() * writes),
              dv(p.value_elems() * writes), dh0(p.state_elems()), dg(p.gate_elems()), dbeta(p.beta_elems() * writes),
              du(p.bonus_elems());
          const float* g = gated(decay) ? t.data("g") : nullptr;
          const float* beta = p.delta() ? t.data("beta") : nullptr;
          const float* u = p.bonus ? t.data("u") : nullptr;
          ForwardArgs<float> fwd{t.data("q"), t.data("k"), t.data("v"), t.data("h0"), o.data(), hT.data(), g, beta};
          fwd.u = u;
          BackwardArgs<float> bwd{t.data("q"),  t.data("k"),   t.data("v"),   t.data("h0"),
                                  t.data("dO"), t.data("dhT"), dq.data(),     dk.data(),
                                  dv.data(),    dh0.data(),    g,             g ? dg.data() : nullptr,
                                  beta,         beta ? dbeta.data() : nullptr};
          bwd.u = u, bwd.du = u ? du.data() : nullptr;
          const auto peak_of = [](auto&& call) {
            CountingAllocator allocator;
            call(allocator);
            CHECK(allocator.live_bytes() == 0);
            return allocator.peak_bytes();
          };
          CHECK(peak_of([&](Allocator& a) { v.forward(p, fwd, a, nullptr); }) == v.forward_workspace_bytes(p, false));
          CHECK(peak_of([&](Allocator& a) { v.backward(p, bwd, a, nullptr); }) == v.backward_workspace_bytes(p, false));
          if (v.kept_states_bytes && v.kept_states_bytes(p) > 0) {
            std::vector<float> kept(v.kept_states_bytes(p) / sizeof(float));
            CHECK(peak_of([&](Allocator& a) { v.forward(p, fwd, a, kept.data()); }) == v.forward_workspace_bytes(p, true));
            CHECK(peak_of([&](Allocator& a) { v.backward(p, bwd, a, kept.data()); }) ==
                  v.backward_workspace_bytes(p, true));
          }
        }
}

TEST_CASE("packed batches: lengths and varlen keys, their canonical text and the seeded draw", "[shapes][config]") {
  CHECK(canonical_lengths("7000 1000  192") == "7000+1000+192");
  CHECK(canonical_lengths("5+1") == "5+1");
  CHECK_THROWS_WITH(canonical_lengths("5 0"), Contains("document length 0 is outside"));
  CHECK_THROWS_WITH(canonical_lengths("5 x"), Contains("'x' is not a whole number"));
  CHECK_THROWS_WITH(canonical_lengths(" "), Contains("no document lengths"));
  CHECK(canonical_varlen("32768 64 8192") == "32768:64:8192:uniform:0");
  CHECK(canonical_varlen("1000:10:100:log:7") == "1000:10:100:log:7");
  CHECK_THROWS_WITH(canonical_varlen("1000 100 10"), Contains("MAX 10 is outside"));
  CHECK_THROWS_WITH(canonical_varlen("1000 10 100 normal"), Contains("distribution 'normal'"));
  CHECK_THROWS_WITH(canonical_varlen("1000 10"), Contains("TOKENS MIN MAX"));

  for (const std::string spec : {"32768:64:8192:uniform:0", "32768:64:8192:log:0", "1000:10:100:uniform:3", "100:64:80:uniform:1"}) {
    INFO(spec);
    const std::vector<int> docs = draw_varlen(spec);
    const std::vector<int> again = draw_varlen(spec);
    CHECK(docs == again);  // seeded: the same every time
    long total = 0;
    for (int n : docs) total += n;
    CHECK(total == std::stol(spec.substr(0, spec.find(':'))));
    const int lo = std::stoi(spec.substr(spec.find(':') + 1)), hi = std::stoi(spec.substr(spec.find(':', spec.find(':') + 1) + 1));
    // Every document within [MIN, MAX] but a last short one that could join no neighbour.
    for (std::size_t i = 0; i < docs.size(); ++i) {
      CHECK(docs[i] <= hi);
      if (i + 1 < docs.size()) CHECK(docs[i] >= lo);
    }
  }
  CHECK(draw_varlen("32768:64:8192:uniform:0") != draw_varlen("32768:64:8192:uniform:1"));
}

namespace {

test::ProcessResult lattnbench(const std::string& args) {
  return test::run_process(test::binary() + " --suite kernel --reps 1 --warmup 0 --min-sample-ms 1 --threads 1 -q " + args);
}

nlohmann::json results_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in)["results"];
}

}  // namespace

TEST_CASE("the shape keys from the command line: records, the settled packed case, refusals", "[shapes][cli][spawns]") {
  const std::filesystem::path dir = test::fresh_dir("shape-keys");
  // heads_k equal to heads and dim_v equal to dim are the square case, run once and recorded
  // without the keys; a packed case is batch 1 of its documents' tokens whatever batch and seq say.
  const auto run = lattnbench("--batch 2 --heads 4 --heads-k 2,4 --dim 16 --dim-v 8,16 --seq 30,50 --lengths '9 1 20' "
                              "--impl scan --mode fwd --out " + (dir / "r.json").string());
  INFO(run.output);
  REQUIRE(run.exit_status == 0);
  const nlohmann::json records = results_of(dir / "r.json");
  REQUIRE(records.size() == 4);  // (heads_k 2, 4) x (dim_v 8, 16); seq 30 and 50 settle to one case
  int square = 0;
  for (const auto& r : records) {
    INFO(r.dump());
    CHECK(r["status"] == "ok");
    CHECK(r["batch"] == 1);
    CHECK(r["seq"] == 30);
    CHECK(r["lengths"] == "9+1+20");
    CHECK(r["documents"] == 3);
    if (!r.contains("heads_k") && !r.contains("dim_v")) ++square;
    if (r.contains("heads_k")) CHECK(r["heads_k"] == 2);
    if (r.contains("dim_v")) CHECK(r["dim_v"] == 8);
  }
  CHECK(square == 1);

  const auto bad_group = lattnbench("--heads 4 --heads-k 3 --seq 16 --dim 8");
  CHECK(bad_group.exit_status == 2);
  CHECK_THAT(bad_group.output, Contains("heads_k 3 does not divide heads 4"));
  const auto both = lattnbench("--lengths '4 4' --varlen '16 2 8' --seq 16 --dim 8");
  CHECK(both.exit_status == 2);
  CHECK_THAT(both.output, Contains("lengths and varlen both pack the batch"));
  const auto zero = lattnbench("--lengths '4 0' --seq 16 --dim 8");
  CHECK(zero.exit_status == 2);
  CHECK_THAT(zero.output, Contains("--lengths") && Contains("document length 0 is outside"));

  // A plugin's interface has square dense tensors only: its rows skip the shapes with the reason.
  const auto plugin = lattnbench("--plugin " LATTN_PLUGIN_mine " --impl mine:scan,scan --heads 2 --heads-k 1 --seq 16 "
                                 "--dim 8 --mode fwd --out " + (dir / "p.json").string());
  INFO(plugin.output);
  REQUIRE(plugin.exit_status == 0);
  int skipped = 0;
  for (const auto& r : results_of(dir / "p.json"))
    if (r["impl"] == "mine:scan") {
      CHECK(r["status"] == "skipped");
      CHECK_THAT(r["skip_reason"].get<std::string>(), Contains("takes square dense cases only"));
      ++skipped;
    } else {
      CHECK(r["status"] == "ok");
    }
  CHECK(skipped == 1);
}
