// The diagonal-plus-low-rank rule (`rule: dplr`, docs/spec.md section 1f): its float64 reference
// (kernels/linear_attention/reference_dplr.cpp) against central finite differences for every
// gradient, against flash-linear-attention's and ggml's recurrences written in their own naming
// (the a/b swap held here), and against the delta rule's rows on the cases the delta rule is:
// KDA, Gated DeltaNet and DeltaNet. The kernels are held to the reference by tests/test_ops.cpp's
// table and by the cases below.
#include <catch2/catch.hpp>

#include <cmath>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/linear_attention/cpu/bf16.hpp"
#include "kernels/linear_attention/packing.hpp"
#include "kernels/linear_attention/reference.hpp"
#include "test_util.hpp"

using namespace lattn;

namespace {

std::vector<double> normals(std::size_t n, std::mt19937_64& rng, double scale = 1.0) {
  std::normal_distribution<double> normal(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = normal(rng);
  return v;
}

Problem shaped(int batch, int heads, int seq, int dim, Decay decay, int heads_k = 0, int dim_v = 0,
               std::vector<int> lengths = {}) {
  Problem p{batch, heads, seq, dim, 64, decay, Rule::dplr};
  p.heads_k = heads_k;
  p.dim_v = dim_v;
  if (!lengths.empty()) {
    p.batch = 1;
    p.cu_seqlens = {0};
    for (int n : lengths) p.cu_seqlens.push_back(p.cu_seqlens.back() + n);
    p.seq = p.cu_seqlens.back();
  }
  return p;
}

struct Inputs {
  std::vector<double> q, k, v, h0, dO, dhT, g, a, b;
  const double* gates() const { return g.empty() ? nullptr : g.data(); }
};

// Generic a and b (not only the suite's contractive ones): the rule's every term is exercised.
Inputs random_inputs(const Problem& p, std::uint64_t seed, double gate_norm) {
  std::mt19937_64 rng(seed);
  Inputs t{normals(p.key_elems(), rng),        normals(p.key_elems(), rng),     normals(p.value_elems(), rng),
           normals(p.state_elems(), rng),      normals(p.value_elems(), rng),   normals(p.state_elems(), rng),
           normals(p.gate_elems(), rng),       normals(p.low_rank_elems(), rng, 0.4),
           normals(p.low_rank_elems(), rng, 0.4)};
  for (double& z : t.g) z = -std::log1p(std::exp(-z)) / gate_norm;
  return t;
}

struct Outputs {
  std::vector<double> o, hT;
};

Outputs run_forward(const Problem& p, const Inputs& t) {
  Outputs out{std::vector<double>(p.value_elems()), std::vector<double>(p.state_elems())};
  reference::forward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), out.o.data(), out.hT.data(), t.gates(),
                         nullptr, t.a.data(), t.b.data()});
  return out;
}

struct Gradients {
  std::vector<double> dq, dk, dv, dh0, dg, da, db;
};

Gradients run_backward(const Problem& p, const Inputs& t) {
  Gradients d{std::vector<double>(p.key_elems()),      std::vector<double>(p.key_elems()),
              std::vector<double>(p.value_elems()),    std::vector<double>(p.state_elems()),
              std::vector<double>(p.gate_elems()),     std::vector<double>(p.low_rank_elems()),
              std::vector<double>(p.low_rank_elems())};
  reference::backward(p, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), d.dq.data(),
                          d.dk.data(), d.dv.data(), d.dh0.data(), t.gates(), d.dg.empty() ? nullptr : d.dg.data(),
                          nullptr, nullptr, t.a.data(), t.b.data(), d.da.data(), d.db.data()});
  return d;
}

double loss(const Problem& p, const Inputs& t) {
  const Outputs out = run_forward(p, t);
  double l = 0;
  for (std::size_t i = 0; i < out.o.size(); ++i) l += out.o[i] * t.dO[i];
  for (std::size_t i = 0; i < out.hT.size(); ++i) l += out.hT[i] * t.dhT[i];
  return l;
}

// max |x - y| / max(1, max |y|): equal to float64 rounding when it is a few ulps.
double relative_gap(const std::vector<double>& x, const std::vector<double>& y) {
  double gap = 0, scale = 1;
  for (std::size_t i = 0; i < x.size(); ++i) {
    gap = std::max(gap, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return gap / scale;
}

}  // namespace

TEST_CASE("dplr reference gradients match central finite differences", "[reference][dplr][grad]") {
  struct Shape {
    Problem p;
    double gate_norm;
  };
  // Every decay; strong gates (gate_norm 1); T past one sqrt(T) checkpoint segment; grouped heads,
  // Dk != Dv both ways and packed documents of unequal lengths.
  const std::vector<Shape> shapes = {
      {shaped(1, 2, 5, 3, Decay::none), 16},      {shaped(1, 2, 5, 3, Decay::retnet), 16},
      {shaped(1, 2, 7, 3, Decay::scalar), 1},      {shaped(1, 2, 5, 3, Decay::vector), 16},
      {shaped(2, 1, 11, 4, Decay::vector), 1},     {shaped(1, 4, 6, 3, Decay::vector, 2, 5), 1},
      {shaped(1, 2, 0, 4, Decay::scalar, 1, 2, {4, 1, 6}), 1}, {shaped(1, 2, 0, 5, Decay::vector, 0, 3, {3, 7}), 1},
  };
  for (const auto& [p, gate_norm] : shapes) {
    INFO(test::describe(p) << " heads_k " << p.qk_heads() << " dim_v " << p.value_dim() << " documents "
                           << p.sequences() << " gate_norm " << gate_norm);
    Inputs t = random_inputs(p, 5, gate_norm);
    const Gradients d = run_backward(p, t);
    auto check_gradient = [&](std::vector<double>& x, const std::vector<double>& grad, const char* name) {
      const double worst = test::worst_fd_error(x, grad, [&] { return loss(p, t); });
      INFO(name << " worst " << worst);
      CHECK(worst < 1e-7);
    };
    check_gradient(t.q, d.dq, "dq");
    check_gradient(t.k, d.dk, "dk");
    check_gradient(t.v, d.dv, "dv");
    check_gradient(t.h0, d.dh0, "dh0");
    check_gradient(t.a, d.da, "da");
    check_gradient(t.b, d.db, "db");
    if (gated(p.decay)) check_gradient(t.g, d.dg, "dg");
  }
}

TEST_CASE("dplr's a and b are flash-linear-attention's b and a, and ggml's b and a", "[reference][dplr]") {
  // FLA (fla/ops/generalized_delta_rule/dplr, naive dplr_recurrence; chunk_dplr_delta_rule(q, k, v,
  // a, b, gk)) keeps S as K x V as we do and steps S <- S . exp(gk) + k v^T + b_fla (a_fla^T S):
  // its a is read from the state, its b written. ggml's rwkv_wkv7(r, w, k, v, a, b, state) keeps
  // the state transposed, V x K, and steps S[i][j] <- S[i][j] w[j] + v[i] k[j] + (sum_l a[l]
  // S[i][l]) b[j], with w = exp(g) and no scale on r: again its a reads, its b writes. Both are
  // written out here in their own naming, and fed our b as their a and our a as their b.
  const Problem p = shaped(1, 2, 9, 4, Decay::vector, 0, 3);
  const Inputs t = random_inputs(p, 23, 1.0);
  const Outputs ours = run_forward(p, t);
  const int Dk = p.dim, Dv = p.value_dim();
  const double scale = attention_scale(Dk);
  std::vector<double> o_fla(p.value_elems()), o_ggml(p.value_elems()), hT_fla(p.state_elems()),
      hT_ggml(p.state_elems());
  for (std::size_t n = 0; n < p.slices(); ++n) {
    const HeadSlice h = p.slice(n);
    const double *q = t.q.data() + h.key, *k = t.k.data() + h.key, *v = t.v.data() + h.value;
    const double *gk = t.g.data() + h.gate, *a_fla = t.b.data() + p.low_rank_offset(h),
                 *b_fla = t.a.data() + p.low_rank_offset(h);
    std::vector<double> S(t.h0.begin() + std::ptrdiff_t(h.state), t.h0.begin() + std::ptrdiff_t(h.state + Dk * Dv));
    std::vector<double> ST(std::size_t(Dv) * Dk);  // ggml's V x K state
    for (int i = 0; i < Dk; ++i)
      for (int j = 0; j < Dv; ++j) ST[std::size_t(j) * Dk + i] = S[std::size_t(i) * Dv + j];
    for (int t_ = 0; t_ < h.seq; ++t_) {
      const std::size_t rk = std::size_t(t_) * Dk, rv = std::size_t(t_) * Dv;
      // FLA: kv = k v^T + b_fla (a_fla^T S); S = S . exp(gk) + kv; o = (scale q)^T S.
      std::vector<double> read(Dv, 0.0);
      for (int i = 0; i < Dk; ++i)
        for (int j = 0; j < Dv; ++j) read[j] += a_fla[rk + i] * S[std::size_t(i) * Dv + j];
      for (int i = 0; i < Dk; ++i)
        for (int j = 0; j < Dv; ++j) {
          const double kv = k[rk + i] * v[rv + j] + b_fla[rk + i] * read[j];
          S[std::size_t(i) * Dv + j] = S[std::size_t(i) * Dv + j] * std::exp(gk[rk + i]) + kv;
        }
      for (int j = 0; j < Dv; ++j) {
        double acc = 0;
        for (int i = 0; i < Dk; ++i) acc += scale * q[rk + i] * S[std::size_t(i) * Dv + j];
        o_fla[h.value + rv + j] = acc;
      }
      // ggml, state row i a value channel: ggml's a = our b (a_fla), its b = our a (b_fla), r = s q.
      for (int i = 0; i < Dv; ++i) {
        double* row = ST.data() + std::size_t(i) * Dk;
        double sa = 0, y = 0;
        for (int j = 0; j < Dk; ++j) sa += a_fla[rk + j] * row[j];
        for (int j = 0; j < Dk; ++j) {
          row[j] = row[j] * std::exp(gk[rk + j]) + v[rv + i] * k[rk + j] + sa * b_fla[rk + j];
          y += row[j] * scale * q[rk + j];
        }
        o_ggml[h.value + rv + i] = y;
      }
    }
    for (int i = 0; i < Dk; ++i)
      for (int j = 0; j < Dv; ++j) {
        hT_fla[h.state + std::size_t(i) * Dv + j] = S[std::size_t(i) * Dv + j];
        hT_ggml[h.state + std::size_t(i) * Dv + j] = ST[std::size_t(j) * Dk + i];
      }
  }
  CHECK(relative_gap(ours.o, o_fla) < 1e-13);
  CHECK(relative_gap(ours.hT, hT_fla) < 1e-13);
  CHECK(relative_gap(ours.o, o_ggml) < 1e-13);
  CHECK(relative_gap(ours.hT, hT_ggml) < 1e-13);
  // And the swap matters: fed unswapped, FLA's recurrence computes another thing.
  Inputs swapped = t;
  std::swap(swapped.a, swapped.b);
  CHECK(relative_gap(run_forward(p, swapped).o, o_fla) > 1e-3);
}

TEST_CASE("dplr with a = -beta k, b = A k and the key beta k is the delta rule, to float64 rounding",
          "[reference][dplr][delta]") {
  // (I - beta k k^T) A S + beta k v^T = A S + (-beta k) ((A k)^T S) + (beta k) v^T, A diagonal: KDA
  // (vector gates), Gated DeltaNet (scalar), DeltaNet (none) and retnet's decay. The gradients by
  // the chain rule through a = -beta k, b = A k, k' = beta k, A = exp(g):
  //   dk_delta = -beta da + A db + beta dk',  dbeta = k . (dk' - da),  dg_delta = dg + (A k) . db
  // (the last summed over channels for scalar gates).
  for (Decay decay : {Decay::vector, Decay::scalar, Decay::none, Decay::retnet}) {
    Problem delta{2, 2, 13, 5, 64, decay, Rule::delta};
    delta.heads_k = 1;
    delta.dim_v = 3;
    Problem dplr = delta;
    dplr.rule = Rule::dplr;
    INFO(to_string(decay));
    std::mt19937_64 rng(31);
    Inputs t = random_inputs(dplr, 37, 1.0);
    // The delta rule's inputs: k L2-normalised, beta = sigmoid(z) per (value head, token).
    for (std::size_t r = 0; r < t.k.size(); r += 5) {
      double norm = 0;
      for (int d = 0; d < 5; ++d) norm += t.k[r + d] * t.k[r + d];
      for (int d = 0; d < 5; ++d) t.k[r + d] /= std::sqrt(norm);
    }
    std::vector<double> beta = normals(delta.beta_elems(), rng);
    for (double& x : beta) x = 1.0 / (1.0 + std::exp(-x));
    // KDA's keys are per q/k head and beta per value head, so dplr's written key beta k is per value
    // head: the q/k heads are expanded to one per value head (a shared key's gradient is then the
    // sum over its value heads, summed back below).
    Problem expanded = dplr;
    expanded.heads_k = 0;
    Inputs u = t;
    u.q.assign(expanded.key_elems(), 0.0);
    u.k.assign(expanded.key_elems(), 0.0);
    const int Dk = dplr.dim;
    const auto decay_of = [&](const HeadSlice& hs, int s, int i) {
      if (decay == Decay::vector) return std::exp(t.g[hs.gate + std::size_t(s) * Dk + i]);
      if (decay == Decay::scalar) return std::exp(t.g[hs.gate + std::size_t(s)]);
      return decay_gamma(decay, hs.head);
    };
    for (std::size_t n = 0; n < dplr.slices(); ++n) {
      const HeadSlice hs = dplr.slice(n), he = expanded.slice(n);
      const std::size_t low = dplr.low_rank_offset(hs);
      for (int s = 0; s < hs.seq; ++s) {
        const double bt = beta[hs.beta + std::size_t(s)];
        for (int i = 0; i < Dk; ++i) {
          const std::size_t rk = std::size_t(s) * Dk + i;
          const double k = t.k[hs.key + rk], A = decay_of(hs, s, i);
          u.q[he.key + rk] = t.q[hs.key + rk];
          u.k[he.key + rk] = bt * k;
          u.a[low + rk] = -bt * k;
          u.b[low + rk] = A * k;
        }
      }
    }
    std::vector<double> o(delta.value_elems()), hT(delta.state_elems());
    reference::forward(delta, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), o.data(), hT.data(), t.gates(),
                               beta.data()});
    const Outputs low = run_forward(expanded, u);
    CHECK(relative_gap(low.o, o) < 1e-13);
    CHECK(relative_gap(low.hT, hT) < 1e-13);

    std::vector<double> dq(delta.key_elems()), dk(delta.key_elems()), dv(delta.value_elems()),
        dh0(delta.state_elems()), dg(delta.gate_elems()), dbeta(delta.beta_elems());
    reference::backward(delta, {t.q.data(), t.k.data(), t.v.data(), t.h0.data(), t.dO.data(), t.dhT.data(), dq.data(),
                                dk.data(), dv.data(), dh0.data(), t.gates(), dg.empty() ? nullptr : dg.data(),
                                beta.data(), dbeta.data()});
    const Gradients d = run_backward(expanded, u);
    CHECK(relative_gap(d.dv, dv) < 1e-13);
    CHECK(relative_gap(d.dh0, dh0) < 1e-13);
    std::vector<double> dq_chain(delta.key_elems(), 0.0), dk_chain(delta.key_elems(), 0.0),
        dbeta_chain(delta.beta_elems(), 0.0), dg_chain = d.dg;
    for (std::size_t n = 0; n < dplr.slices(); ++n) {
      const HeadSlice hs = dplr.slice(n), he = expanded.slice(n);
      const std::size_t low = dplr.low_rank_offset(hs);
      for (int s = 0; s < hs.seq; ++s) {
        const double bt = beta[hs.beta + std::size_t(s)];
        for (int i = 0; i < Dk; ++i) {
          const std::size_t rk = std::size_t(s) * Dk + i;
          const double k = t.k[hs.key + rk], A = decay_of(hs, s, i);
          dq_chain[hs.key + rk] += d.dq[he.key + rk];
          dk_chain[hs.key + rk] += -bt * d.da[low + rk] + A * d.db[low + rk] + bt * d.dk[he.key + rk];
          dbeta_chain[hs.beta + std::size_t(s)] += k * (d.dk[he.key + rk] - d.da[low + rk]);
          if (decay == Decay::vector) dg_chain[hs.gate + rk] += A * k * d.db[low + rk];
          if (decay == Decay::scalar) dg_chain[hs.gate + std::size_t(s)] += A * k * d.db[low + rk];
        }
      }
    }
    CHECK(relative_gap(dq_chain, dq) < 1e-13);
    CHECK(relative_gap(dk_chain, dk) < 1e-13);
    CHECK(relative_gap(dbeta_chain, dbeta) < 1e-13);
    if (gated(decay)) CHECK(relative_gap(dg_chain, dg) < 1e-13);
  }
}

namespace {

// A dplr case of `impl` with the section 1c keys, settled as the plan settles it.
struct ShapeCase {
  int batch, heads, heads_k, seq, dim, dim_v, chunk;
  std::string lengths = "";
};

Case dplr_case(const ShapeCase& s, Decay decay, const std::string& impl, Mode mode, const std::string& gate_norm) {
  Problem p{s.batch, s.heads, s.seq, s.dim, s.chunk, decay, Rule::dplr};
  Case c = test::kernel_case(p, impl, mode);
  c.options["heads_k"] = std::to_string(s.heads_k);
  c.options["dim_v"] = std::to_string(s.dim_v);
  if (!s.lengths.empty()) c.options["lengths"] = canonical_lengths(s.lengths);
  if (gated(decay)) c.options["gate_norm"] = gate_norm;
  if (c.op->settle) c.op->settle(c);
  return c;
}

// Ragged T (not a multiple of the chunk or the scan's tile of 64), D not a multiple of any vector
// width, grouped heads (one q/k head for all, and half), Dv below and above Dk, packed documents
// from 1 token to past a tile, and D 128.
std::vector<ShapeCase> dplr_shapes() {
  return {{2, 2, 2, 100, 16, 16, 16},          {1, 3, 3, 37, 5, 5, 8},
          {2, 4, 1, 45, 32, 16, 16},           {1, 4, 2, 70, 24, 40, 16},
          {1, 4, 2, 1, 32, 32, 16, "37 1 64 90"}, {1, 2, 2, 150, 128, 128, 64}};
}

std::string describe(const ShapeCase& s) {
  return "B" + std::to_string(s.batch) + " H" + std::to_string(s.heads) + " Hk" + std::to_string(s.heads_k) + " T" +
         std::to_string(s.seq) + " Dk" + std::to_string(s.dim) + " Dv" + std::to_string(s.dim_v) + " C" +
         std::to_string(s.chunk) + (s.lengths.empty() ? "" : " lengths " + s.lengths);
}

}  // namespace

TEST_CASE("dplr scan and chunked forms match the float64 reference on every decay, shape and vector width",
          "[dplr][scan][chunked][shapes]") {
  // The case outermost and the impls, widths and thread counts inside it: its inputs and reference
  // are made once for all of them.
  auto one = make_backend("cpu", BackendOptions{1}), three = make_backend("cpu", BackendOptions{3});
  int checked = 0;
  for (const ShapeCase& shape : dplr_shapes())
    for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector})
      for (const std::string gate_norm : {"16", "1"}) {
        if (gate_norm == "1" && !gated(decay)) continue;
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd})
          for (const std::string impl : {"scan", "chunked"})
            for (const cpu::Vec vec : cpu::available_vecs())
              for (Backend* backend : {one.get(), three.get()}) {
                const test::VecOverride force(vec);
                const Case kase = dplr_case(shape, decay, impl, mode, gate_norm);
                INFO(impl << " " << describe(shape) << " " << to_string(decay) << " gate_norm " << gate_norm << " "
                          << to_string(mode) << " " << cpu::to_string(vec) << " threads "
                          << (backend == one.get() ? 1 : 3));
                REQUIRE_FALSE(backend->unsupported(kase));
                CHECK(backend->variant(kase) == impl + "_dplr");
                const test::Outcome out = test::run_on(*backend, kase);
                INFO(test::errors(out.check));
                CHECK(out.check.passed);
                // Every gradient is checked, da and db among them.
                if (mode == Mode::fwd_bwd) {
                  CHECK(out.check.per_output.count("da") == 1);
                  CHECK(out.check.per_output.count("db") == 1);
                  CHECK(out.check.per_output.count("dg") == (gated(decay) ? 1u : 0u));
                }
                ++checked;
              }
      }
  CHECK(checked == int(dplr_shapes().size()) * 6 * 2 * 2 * int(cpu::available_vecs().size()) * 2);
}

TEST_CASE("dplr chunked form takes gates far stronger than the suite's without overflow", "[dplr][chunked][gates]") {
  // gate_norm 0.05: log-gates of -14 a token on average, cumulative sums past -800 over a chunk of
  // 64, where exp(G) underflows and exp(-G) overflows float32 and double alike: only differences
  // within the chunk, each <= 0, keep the factors finite.
  auto backend = make_backend("cpu", BackendOptions{2});
  for (const std::string impl : {"chunked", "scan"})
    for (Decay decay : {Decay::scalar, Decay::vector})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        const Case kase = dplr_case({1, 2, 2, 150, 32, 24, 64}, decay, impl, mode, "0.05");
        INFO(impl << " " << to_string(decay) << " " << to_string(mode));
        const test::Outcome out = test::run_on(*backend, kase);
        INFO(test::errors(out.check));
        CHECK(out.check.passed);
      }
}

TEST_CASE("dplr: the kernel suite runs both forms and modes from the command line, every output checked",
          "[dplr][cli][spawns]") {
  const auto dir = test::fresh_dir("dplr-cli");
  const std::string out = (dir / "k.json").string();
  // T 100 (ragged against the chunk 16 and the scan's tile), strong gates.
  const test::ProcessResult r = test::run_process(
      "timeout 300 " + test::binary() + " --suite kernel --rule dplr --decay vector --impl scan,chunked "
      "--mode fwd,fwd_bwd --batch 2 --heads 2 --seq 100 --dim 16 --chunk 16 --gate-norm 1 --reps 1 --warmup 0 "
      "--min-sample-ms 1 --threads 2 --out " + out);
  INFO(r.output);
  REQUIRE(r.exit_status == 0);
  std::ifstream file(out);
  const nlohmann::json doc = nlohmann::json::parse(file);
  REQUIRE(doc["results"].size() == 4);
  for (const auto& rec : doc["results"]) {
    INFO(rec.dump());
    CHECK(rec["status"] == "ok");
    CHECK(rec["rule"] == "dplr");
    CHECK(rec["variant"] == rec["impl"].get<std::string>() + "_dplr");
    const bool backward = rec["mode"] == "fwd_bwd";
    std::vector<std::string> names = {"o", "hT"};
    if (backward) names.insert(names.end(), {"dq", "dk", "dv", "dh0", "dg", "da", "db"});
    CHECK(rec["rel_errs"].size() == names.size());
    for (const std::string& name : names) {
      INFO(name);
      REQUIRE(rec["rel_errs"].contains(name));
      CHECK(rec["rel_errs"][name].get<double>() < 1e-4);
    }
  }
}

TEST_CASE("dplr: bf16 cases run the float32 rows behind the converter, every output checked", "[dplr][bf16]") {
  // Forced as a CPU with AVX512-BF16 would have it (the converter itself runs anywhere): q, k, v and
  // dO in bf16, a, b and g in float32 as the other per-token inputs are.
  cpu::set_bf16_override(true);
  auto backend = make_backend("cpu", BackendOptions{2});
  for (const std::string impl : {"scan", "chunked"})
    for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
      Case kase = dplr_case({1, 4, 2, 45, 16, 24, 16}, Decay::vector, impl, mode, "1");
      kase.dtype = "bf16";
      INFO(impl << " " << to_string(mode));
      REQUIRE_FALSE(backend->unsupported(kase));
      CHECK(backend->variant(kase) == impl + "_dplr+bf16cvt");
      const test::Outcome out = test::run_on(*backend, kase);
      INFO(test::errors(out.check));
      CHECK(out.check.passed);
      if (mode == Mode::fwd_bwd) CHECK(out.check.per_output.count("db") == 1);
    }
  cpu::set_bf16_override(std::nullopt);
}
