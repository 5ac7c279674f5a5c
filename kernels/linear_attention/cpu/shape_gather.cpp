// The gather adapter of cpu/shape_gather.hpp. Its test: tests/kernels/test_shapes.cpp, which holds every
// variant run this way to the float64 reference on grouped, rectangular and packed shapes.
#include "kernels/linear_attention/cpu/shape_gather.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace lattn::cpu {
namespace {

// One square dense call: `batch` sequences of `seq` tokens from token `start` of the problem's
// rows, their states from state index `first_state` on.
struct Run {
  int batch, start, seq, first_state;
};

std::vector<Run> runs_of(const Problem& p) {
  if (!p.packed()) return {{p.batch, 0, p.seq, 0}};
  std::vector<Run> runs;
  for (std::size_t n = 0; n + 1 < p.cu_seqlens.size(); ++n)
    runs.push_back({1, p.cu_seqlens[n], p.cu_seqlens[n + 1] - p.cu_seqlens[n], int(n)});
  return runs;
}

int padded_dim(const Problem& p) { return std::max(p.dim, p.value_dim()); }

Problem square(const Problem& p, int batch, int seq) {
  return Problem{batch, p.heads, seq, padded_dim(p), p.chunk, p.decay, p.rule};
}

// The square problem of the longest run: the copies are sized for it and reused by the others.
Problem biggest(const Problem& p, const std::vector<Run>& runs) {
  int most = 0;
  for (const Run& r : runs) most = std::max(most, r.seq);
  return square(p, runs[0].batch, most);
}

// The copies of one square call: every tensor the kernel reads or writes.
struct Copies {
  float *q, *k, *v, *o, *g, *beta, *h0, *hT;      // forward
  float *dO, *dhT, *dq, *dk, *dv, *dh0, *dg, *dbeta;  // backward (null in a forward)
};

std::size_t copies_floats(const Problem& s, bool backward) {
  const std::size_t tok = s.token_elems(), st = s.state_elems(), gate = s.gate_elems(),
                    beta = s.delta() ? s.beta_elems() : 0;
  if (!backward) return 4 * tok + gate + beta + 2 * st;  // q k v o, g, beta, h0 hT
  return 7 * tok + 2 * gate + 2 * beta + 3 * st;         // q k v dO dq dk dv, g dg, beta dbeta, h0 dhT dh0
}

Copies carve(const Problem& s, float* base, bool backward) {
  const std::size_t tok = s.token_elems(), st = s.state_elems(), gate = s.gate_elems(),
                    beta = s.delta() ? s.beta_elems() : 0;
  Copies c{};
  const auto take = [&](std::size_t n) {
    float* at = n ? base : nullptr;
    base += n;
    return at;
  };
  c.q = take(tok), c.k = take(tok), c.v = take(tok), c.g = take(gate), c.beta = take(beta), c.h0 = take(st);
  if (!backward) {
    c.o = take(tok), c.hT = take(st);
    return c;
  }
  c.dO = take(tok), c.dq = take(tok), c.dk = take(tok), c.dv = take(tok);
  c.dg = take(gate), c.dbeta = take(beta), c.dhT = take(st), c.dh0 = take(st);
  return c;
}

// Index maps between the problem's rows and a run's square copy: (b, h, t) of the copy.
struct Map {
  const Problem& p;
  const Run& r;
  int P;
  std::size_t src_b(int b) const { return p.packed() ? 0 : std::size_t(b); }
  std::size_t key_row(int b, int h, int t) const {  // q/k row of value head h
    return ((src_b(b) * p.qk_heads() + std::size_t(h / p.group())) * p.seq + std::size_t(r.start + t)) * p.dim;
  }
  std::size_t value_row(int b, int h, int t) const {
    return ((src_b(b) * p.heads + std::size_t(h)) * p.seq + std::size_t(r.start + t)) * p.value_dim();
  }
  std::size_t token(int b, int h, int t) const {  // scalar gates, beta
    return (src_b(b) * p.heads + std::size_t(h)) * p.seq + std::size_t(r.start + t);
  }
  std::size_t state(int b, int h) const {
    return (std::size_t(r.first_state + b) * p.heads + std::size_t(h)) * p.dim * p.value_dim();
  }
  std::size_t copy_row(int b, int h, int t) const { return ((std::size_t(b) * p.heads + h) * r.seq + t) * P; }
  std::size_t copy_token(int b, int h, int t) const { return (std::size_t(b) * p.heads + h) * r.seq + t; }
  std::size_t copy_state(int b, int h) const { return (std::size_t(b) * p.heads + h) * P * P; }
};

// Copies `cols` values of `src` into a row of P, zero beyond, times `scale`.
void put_row(float* dst, const float* src, int cols, int P, float scale = 1.0f) {
  for (int i = 0; i < cols; ++i) dst[i] = src[i] * scale;
  std::fill(dst + cols, dst + P, 0.0f);
}
void put_state(float* dst, const float* src, int rows, int cols, int P) {
  for (int i = 0; i < rows; ++i) put_row(dst + std::size_t(i) * P, src + std::size_t(i) * cols, cols, P);
  std::fill(dst + std::size_t(rows) * P, dst + std::size_t(P) * P, 0.0f);
}
void take_state(float* dst, const float* src, int rows, int cols, int P) {
  for (int i = 0; i < rows; ++i) std::copy_n(src + std::size_t(i) * P, cols, dst + std::size_t(i) * cols);
}

// The inputs both directions read: q, k, v, g, beta, h0 (and dO, dhT in a backward).
void gather_inputs(const Map& m, const Copies& c, const float* q, const float* k, const float* v, const float* g,
                   const float* beta, const float* h0, const float* dO, const float* dhT) {
  const Problem& p = m.p;
  const int P = m.P, Dk = p.dim, Dv = p.value_dim(), W = p.gate_width();
  const float scale = float(std::sqrt(double(P) / Dk));
  const long pairs = long(m.r.batch) * p.heads;
#pragma omp parallel for schedule(static)
  for (long bh = 0; bh < pairs; ++bh) {
    const int b = int(bh / p.heads), h = int(bh % p.heads);
    for (int t = 0; t < m.r.seq; ++t) {
      const std::size_t at = m.copy_row(b, h, t);
      put_row(c.q + at, q + m.key_row(b, h, t), Dk, P, scale);
      put_row(c.k + at, k + m.key_row(b, h, t), Dk, P);
      put_row(c.v + at, v + m.value_row(b, h, t), Dv, P);
      if (dO) put_row(c.dO + at, dO + m.value_row(b, h, t), Dv, P);
      if (W == 1) c.g[m.copy_token(b, h, t)] = g[m.token(b, h, t)];
      if (W > 1) put_row(c.g + at, g + m.token(b, h, t) * std::size_t(W), Dk, P);
      if (beta) c.beta[m.copy_token(b, h, t)] = beta[m.token(b, h, t)];
    }
    put_state(c.h0 + m.copy_state(b, h), h0 + m.state(b, h), Dk, Dv, P);
    if (dhT) put_state(c.dhT + m.copy_state(b, h), dhT + m.state(b, h), Dk, Dv, P);
  }
}

// Calls body(r, s, c, m) for each run r of p in turn: its square problem s, its copies c (one block
// from the allocator, sized for the longest run) and its index maps m.
template <class Body>
void each_run(const Problem& p, Allocator& allocator, bool backward, Body body) {
  const std::vector<Run> runs = runs_of(p);
  Workspace<float> scratch(allocator, copies_floats(biggest(p, runs), backward));
  for (const Run& r : runs) {
    const Problem s = square(p, r.batch, r.seq);
    body(r, s, carve(s, scratch.data(), backward), Map{p, r, padded_dim(p)});
  }
}

void run_forward(const CpuVariant& inner, const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  each_run(p, allocator, false, [&](const Run& r, const Problem& s, const Copies& c, const Map& m) {
    gather_inputs(m, c, a.q, a.k, a.v, a.g, a.beta, a.h0, nullptr, nullptr);
    inner.forward(s, {c.q, c.k, c.v, c.h0, c.o, c.hT, c.g, c.beta}, allocator, nullptr);
    const long pairs = long(r.batch) * p.heads;
    const int P = m.P, Dk = p.dim, Dv = p.value_dim();
#pragma omp parallel for schedule(static)
    for (long bh = 0; bh < pairs; ++bh) {
      const int b = int(bh / p.heads), h = int(bh % p.heads);
      for (int t = 0; t < r.seq; ++t) std::copy_n(c.o + m.copy_row(b, h, t), Dv, a.o + m.value_row(b, h, t));
      take_state(a.hT + m.state(b, h), c.hT + m.copy_state(b, h), Dk, Dv, P);
    }
  });
}

void run_backward(const CpuVariant& inner, const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  each_run(p, allocator, true, [&](const Run& r, const Problem& s, const Copies& c, const Map& m) {
    gather_inputs(m, c, a.q, a.k, a.v, a.g, a.beta, a.h0, a.dO, a.dhT);
    inner.backward(s, {c.q, c.k, c.v, c.h0, c.dO, c.dhT, c.dq, c.dk, c.dv, c.dh0, c.g, c.dg, c.beta, c.dbeta},
                   allocator, nullptr);
    const int P = m.P, Dk = p.dim, Dv = p.value_dim(), W = p.gate_width(), G = p.group();
    const float scale = float(std::sqrt(double(P) / Dk));
    const long pairs = long(r.batch) * p.heads;
#pragma omp parallel for schedule(static)
    for (long bh = 0; bh < pairs; ++bh) {
      const int b = int(bh / p.heads), h = int(bh % p.heads);
      for (int t = 0; t < r.seq; ++t) {
        const std::size_t at = m.copy_row(b, h, t);
        std::copy_n(c.dv + at, Dv, a.dv + m.value_row(b, h, t));
        if (W == 1) a.dg[m.token(b, h, t)] = c.dg[m.copy_token(b, h, t)];
        if (W > 1) std::copy_n(c.dg + at, Dk, a.dg + m.token(b, h, t) * std::size_t(W));
        if (a.dbeta) a.dbeta[m.token(b, h, t)] = c.dbeta[m.copy_token(b, h, t)];
        if (h % G != 0) continue;  // dq, dk: the first value head of a group sums the group's
        float* dq = a.dq + m.key_row(b, h, t);
        float* dk = a.dk + m.key_row(b, h, t);
        for (int i = 0; i < Dk; ++i) {
          float sq = 0, sk = 0;
          for (int member = 0; member < G; ++member) {
            const std::size_t row = m.copy_row(b, h + member, t);
            sq += c.dq[row + i];
            sk += c.dk[row + i];
          }
          dq[i] = sq * scale;
          dk[i] = sk;
        }
      }
      take_state(a.dh0 + m.state(b, h), c.dh0 + m.copy_state(b, h), Dk, Dv, P);
    }
  });
}

// Peak scratch: the copies for the longest run, and the largest kernel scratch of any run.
std::size_t gathered_bytes(const CpuVariant& inner, const Problem& p, bool backward) {
  const std::vector<Run> runs = runs_of(p);
  std::size_t inner_most = 0;
  std::vector<int> seen;
  for (const Run& r : runs) {
    if (std::find(seen.begin(), seen.end(), r.seq) != seen.end()) continue;
    seen.push_back(r.seq);
    const Problem s = square(p, r.batch, r.seq);
    inner_most = std::max(inner_most, backward ? inner.backward_workspace_bytes(s, false)
                                               : inner.forward_workspace_bytes(s, false));
  }
  return copies_floats(biggest(p, runs), backward) * sizeof(float) + inner_most;
}

}  // namespace

Problem gathered_problem(const Problem& problem) {
  return biggest(problem, runs_of(problem));
}

CpuVariant gathered(const CpuVariant& inner) {
  CpuVariant v;
  v.name = inner.name + "+gather";
  v.takes = inner.takes;
  v.takes.shapes = true;
  v.forward = [inner](const Problem& p, const ForwardArgs<float>& a, Allocator& m, float* keep) {
    if (keep) throw std::logic_error(inner.name + "+gather keeps no chunk states");
    run_forward(inner, p, a, m);
  };
  v.backward = [inner](const Problem& p, const BackwardArgs<float>& a, Allocator& m, const float* kept) {
    if (kept) throw std::logic_error(inner.name + "+gather takes no kept chunk states");
    run_backward(inner, p, a, m);
  };
  v.forward_workspace_bytes = [inner](const Problem& p, bool) { return gathered_bytes(inner, p, false); };
  v.backward_workspace_bytes = [inner](const Problem& p, bool) { return gathered_bytes(inner, p, true); };
  return v;
}

}  // namespace lattn::cpu
