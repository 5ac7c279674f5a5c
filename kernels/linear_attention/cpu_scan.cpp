// Scan (recurrent) form on the CPU, float32, forward and backward, the additive rule with every
// decay (docs/spec.md section 1): the `scan_columns` row of cpu_variants.cpp.
//
// Every pass is a run_scan_pass (cpu_scan_pass.hpp) over one head's D x D state. Columns of a state
// are independent, so the work items are (head, block of W state columns): with at least as many
// heads as threads, whole heads are handed out dynamically; with fewer, each thread takes a
// contiguous range of items, so one head's columns are split. One level of threading, no BLAS.
//
// Forward:  S_t = gamma S_{t-1} + k_t v_t^T, o_t = s S_t^T q_t.
// Backward, O(B*H*D^2) scratch and no per-token state, three passes that each read out along the
// state's columns (a read-out along rows would need a horizontal sum per row and token):
//   dq: P = S^T from h0^T forward,      P_t = gamma P_{t-1} + v_t k_t^T,        dq_t = s P_t^T do_t
//   dv: G from dhT in reverse,          G_t = gamma G_{t+1} + s q_t do_t^T,     dv_t = G_t^T k_t
//   dk: G^T from dhT^T in reverse,      G^T_t = gamma G^T_{t+1} + s do_t q_t^T, dk_t = G_t v_t
// and dh0 = gamma G_1. That is 16 D^2 flops per token and head where a fused reverse recurrence
// needs 14 D^2 plus a horizontal sum per row and token.
//
// A pass holds its state packed by column blocks: block [c, c + w) as a D x w matrix at offset
// c * D. In the D x D layout a block's rows are D * 4 bytes apart; at D = 128 that is 512 bytes,
// so the block's 256 cache lines fall into 16 of L1's 64 sets and evict each other (measured:
// 51 GFLOP/s on one core at D = 128 against 83 at D = 32, then ~80 packed). Packed, the 16 KiB
// block stays in L1.
// Scratch: forward, one packed D x D per thread; backward, one per head (h0^T, then dhT^T) and
// one per thread (G).
//
// Gated decays (docs/spec.md section 1b) change only the factor each step scales the state by: exp(g_t)
// (scalar gates), or exp(g_t) per key channel (vector gates: the rows of S and G, the columns of
// S^T and G^T). The reverse recurrences decay by the gate of the token after, G_t = A_{t+1} G_{t+1}
// + s q_t do_t^T, and dh0 = A_0 G_0. The exponentials are taken once per token tile into a buffer
// of (tile + 1) x width floats per thread, which every column block and both reverse passes read;
// no pass makes a sweep of its own over the gates. dg comes after the passes, from the identity
//   dg_t = rowsum(dh0 . h0) - sum_{tau < t} (q_tau . dq_tau - k_tau . dk_tau)
// (per key channel for vector gates, summed over them for scalar gates; docs/kernels.md derives
// it), summed in double, D doubles per thread.
#include <omp.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu.hpp"
#include "kernels/linear_attention/cpu_scan.hpp"
#include "kernels/linear_attention/cpu_scan_pass.hpp"
#include "kernels/linear_attention/cpu_scan_split.hpp"

namespace lattn::cpu {
namespace {

// Tokens per tile when one thread walks several column blocks of a head (or two passes): the
// tile's row operands (2 to 4 * tile * D floats) are then read from L2 by every block after the
// first. A multiple of the tokens per walk (6 on AVX-512): with 32, every tile ended in a walk of
// 2 tokens, which does a third of the work for the same loads and stores.
int tile_tokens(Vec vec) {
  const int u = scan_tokens_per_walk(vec);
  return (32 + u - 1) / u * u + (u > 2 ? 2 * u : 0);
}

// Packs columns [c0, c1) of src (D x D, or its transpose) into the block layout above.
void pack(const float* src, bool transposed, float* buf, int D, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, D - c);
    float* blk = buf + std::size_t(c) * D;
    for (int i = 0; i < D; ++i)
      for (int j = 0; j < w; ++j)
        blk[std::size_t(i) * w + j] = transposed ? src[std::size_t(c + j) * D + i] : src[std::size_t(i) * D + c + j];
  }
}

// dst = scale * buf, row i also times row_scale[i * row_step] when row_scale is given.
void unpack(const float* buf, float* dst, float scale, int D, int W, int c0, int c1, const float* row_scale = nullptr,
            int row_step = 0) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, D - c);
    const float* blk = buf + std::size_t(c) * D;
    for (int i = 0; i < D; ++i) {
      const float f = row_scale ? scale * row_scale[std::size_t(i) * row_step] : scale;
      for (int j = 0; j < w; ++j) dst[std::size_t(i) * D + c + j] = f * blk[std::size_t(i) * w + j];
    }
  }
}

// The gates of one head, for run_packed: exp(g) of each tile's tokens and of the one after it (the
// reverse passes decay by the next token's gate) go to `buf` before the tile's passes run.
struct TileGates {
  const float* g = nullptr;  // this head's log-gates, [T][width]; null: not gated
  int width = 0;             // per token: D (vector gates) or 1 (scalar)
  float* buf = nullptr;      // (tile + 1) x width floats of this thread
};

void take_gates(const TileGates& gates, int t0, int tokens) {
  const float* __restrict g = gates.g + std::size_t(t0) * gates.width;
  float* __restrict out = gates.buf;
  const int n = tokens * gates.width;
#pragma omp simd
  for (int e = 0; e < n; ++e) out[e] = exp_nonpositive(g[e]);
}

// Runs each pass (its S unset) on columns [c0, c1) of its own packed state, a tile of tokens at a
// time: within a tile, every block of the first pass, then every block of the second. Passes that
// walk the same tokens in the same direction (dv and dk) then read each tile's token rows from
// memory once between them, and several column blocks of one head read them from L2.
// Gated passes always go by tiles (the gates' buffer holds one), and read that tile's gates.
void run_packed(std::initializer_list<std::pair<ScanPass, float*>> passes, int c0, int c1, int W, Vec vec,
                const TileGates& gates = {}) {
  const ScanPass& first = passes.begin()->first;
  const int D = first.D, T = first.T;
  const int tile = (gates.g || c1 - c0 > W || passes.size() > 1) ? tile_tokens(vec) : T;
  for (int done = 0; done < T; done += tile) {
    const int n = std::min(tile, T - done);
    if (gates.g) {
      const int t0 = first.reverse ? T - done - n : done;  // every pass of a call walks one way
      take_gates(gates, t0, std::min(n + 1, T - t0));
    }
    for (const auto& [pass, buf] : passes) {
      const int t0 = pass.reverse ? T - done - n : done;  // first token of the tile
      const std::size_t off = std::size_t(t0) * D;
      ScanPass sub = pass;
      sub.T = n;
      sub.upd_row += off;
      sub.upd_col += off;
      sub.read_row += off;
      sub.out += off;
      sub.decay_first = pass.decay_first || done > 0;
      sub.gate = gates.g ? gates.buf : nullptr;
      for (int c = c0; c < c1; c += W) {
        sub.S = buf + std::size_t(c) * D;
        sub.ld = std::min(W, D - c);
        sub.s_col0 = c;
        sub.prefetch_next_rows = c == c0;
        run_scan_pass(sub, c, std::min(c1, c + W), vec);
      }
    }
  }
}

}  // namespace

int head_parallel_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.heads_total()));
}

int scan_threads(const Problem& p) { return scan_split(p, scan_column_block(active_vec())).threads; }

// A thread's gate buffer (TileGates), 0 without gates.
std::size_t gate_tile_floats(const Problem& p) {
  return gated(p.decay) ? std::size_t(tile_tokens(active_vec()) + 1) * p.gate_width() : 0;
}

std::size_t scan_columns_forward_floats(const Problem& p) {
  return std::size_t(scan_threads(p)) * (p.head_state_elems() + gate_tile_floats(p));
}

// The gated backward's dg sums: D doubles per thread of its own loop (after the passes' scratch
// is freed).
std::size_t gate_gradient_floats(const Problem& p) {
  return gated(p.decay) ? std::size_t(head_parallel_threads(p)) * 2 * p.dim : 0;
}

std::size_t scan_columns_backward_floats(const Problem& p) {
  const std::size_t passes = p.heads_total() * p.head_state_elems() +
                             std::size_t(scan_threads(p)) * (p.head_state_elems() + gate_tile_floats(p));
  return std::max(passes, gate_gradient_floats(p));
}

namespace {

// The passes of one head, bh, of the kernels below (the mathematics in this file's header).
struct HeadPasses {
  const Problem& p;
  float s;  // the attention scale

  ScanPass pass(long bh, const float* upd_row, const float* upd_col, const float* read_row, float* out) const {
    const std::size_t tok = bh * p.head_token_elems();
    ScanPass pass;
    pass.T = p.seq;
    pass.D = p.dim;
    pass.upd_row = upd_row + tok;
    pass.upd_col = upd_col + tok;
    pass.read_row = read_row + tok;
    pass.out = out + tok;
    pass.gamma = float(decay_gamma(p.decay, int(bh % p.heads)));
    pass.stream_out = true;
    pass.gate_stride = p.gate_width();
    return pass;
  }
  // A pass over S or G scales their rows by vector gates; one over S^T or G^T, their columns.
  ScanPass with_gate(ScanPass pass, bool transposed, int shift) const {
    pass.gate_scale = p.decay == Decay::scalar ? GateScale::scalar : transposed ? GateScale::columns : GateScale::rows;
    pass.gate_shift = shift;
    return pass;
  }
  TileGates gates(long bh, const float* g, float* buf) const {
    if (!g) return {};
    return {g + bh * p.head_gate_elems(), p.gate_width(), buf};
  }
  ScanPass forward(long bh, const ForwardArgs<float>& a) const {
    ScanPass o = with_gate(pass(bh, a.k, a.v, a.q, a.o), false, 0);
    o.out_scale = s;
    return o;
  }
  ScanPass dq(long bh, const BackwardArgs<float>& a) const {
    ScanPass dq = with_gate(pass(bh, a.v, a.k, a.dO, a.dq), true, 0);
    dq.out_scale = s;
    return dq;
  }
  // dv on G and dk on G^T, from dhT, in reverse; G and P are scratch packed states; dh0 out.
  // gate_buf: this thread's TileGates buffer; after the walk it holds exp(g_0), A_0's factors.
  void reverse(long bh, const BackwardArgs<float>& a, float* G, float* P, float* gate_buf, int c0, int c1, int W,
               Vec vec) const {
    const int D = p.dim;
    const std::size_t st = bh * p.head_state_elems();
    pack(a.dhT + st, false, G, D, W, c0, c1);
    pack(a.dhT + st, true, P, D, W, c0, c1);
    ScanPass dv = with_gate(pass(bh, a.q, a.dO, a.k, a.dv), false, 1);
    dv.upd_scale = s;
    dv.decay_first = false;
    dv.reverse = true;
    ScanPass dk = with_gate(pass(bh, a.dO, a.q, a.v, a.dk), true, 1);
    dk.upd_scale = s;
    dk.decay_first = false;
    dk.reverse = true;
    const TileGates tg = gates(bh, a.g, gate_buf);
    run_packed({{dv, G}, {dk, P}}, c0, c1, W, vec, tg);
    if (tg.g) unpack(G, a.dh0 + st, 1.0f, D, W, c0, c1, tg.buf, p.decay == Decay::vector ? 1 : 0);
    else unpack(G, a.dh0 + st, dv.gamma, D, W, c0, c1);
  }
};

}  // namespace

void scan_columns_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const int D = p.dim;
  const Split split = scan_split(p, scan_column_block(active_vec()));
  const Vec vec = active_vec();
  const HeadPasses passes{p, float(attention_scale(D))};
  const std::size_t per_thread = p.head_state_elems() + gate_tile_floats(p);
  Workspace<float> state(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
  {
    float* buf = state.data() + omp_get_thread_num() * per_thread;
    float* gate_buf = buf + p.head_state_elems();
    for_each_share(split, [&](long bh, int c0, int c1) {
      const std::size_t st = bh * p.head_state_elems();
      pack(a.h0 + st, false, buf, D, split.width, c0, c1);
      run_packed({{passes.forward(bh, a), buf}}, c0, c1, split.width, vec, passes.gates(bh, a.g, gate_buf));
      unpack(buf, a.hT + st, 1.0f, D, split.width, c0, c1);
    });
  }
}

namespace {

// dg of every head from the finished dq, dk and dh0 (this file's header): one head per thread.
void gate_gradient(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int T = p.seq, D = p.dim, width = p.gate_width();
  const int threads = head_parallel_threads(p);
  Workspace<float> sums(allocator, gate_gradient_floats(p));
#pragma omp parallel num_threads(threads)
  {
    double* __restrict acc = reinterpret_cast<double*>(sums.data() + std::size_t(omp_get_thread_num()) * 2 * D);
#pragma omp for schedule(dynamic, 1)
    for (long bh = 0; bh < long(p.heads_total()); ++bh) {
      const std::size_t tok = bh * p.head_token_elems(), st = bh * p.head_state_elems();
      const float *q = a.q + tok, *k = a.k + tok, *dq = a.dq + tok, *dk = a.dk + tok;
      const float *dh0 = a.dh0 + st, *h0 = a.h0 + st;
      float* dg = a.dg + bh * p.head_gate_elems();
      for (int i = 0; i < D; ++i) {
        double sum = 0;
        for (int j = 0; j < D; ++j) sum += double(dh0[std::size_t(i) * D + j]) * h0[std::size_t(i) * D + j];
        acc[i] = sum;
      }
      if (width == 1) {
        double total = 0;
        for (int i = 0; i < D; ++i) total += acc[i];
        for (int t = 0; t < T; ++t) {
          const std::size_t r = std::size_t(t) * D;
          dg[t] = float(total);
          double step = 0;
#pragma omp simd reduction(+ : step)
          for (int i = 0; i < D; ++i) step += double(q[r + i]) * dq[r + i] - double(k[r + i]) * dk[r + i];
          total -= step;
        }
      } else {
        for (int t = 0; t < T; ++t) {
          const std::size_t r = std::size_t(t) * D;
#pragma omp simd
          for (int i = 0; i < D; ++i) {
            dg[r + i] = float(acc[i]);
            acc[i] -= double(q[r + i]) * dq[r + i] - double(k[r + i]) * dk[r + i];
          }
        }
      }
    }
  }
}

}  // namespace

void scan_columns_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int D = p.dim;
  const Split split = scan_split(p, scan_column_block(active_vec()));
  const Vec vec = active_vec();
  const HeadPasses passes{p, float(attention_scale(D))};
  const std::size_t DD = p.head_state_elems();
  {
    const std::size_t per_thread = DD + gate_tile_floats(p);
    Workspace<float> starts(allocator, p.heads_total() * DD);
    Workspace<float> carried(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
    {
      float* G = carried.data() + omp_get_thread_num() * per_thread;
      float* gate_buf = G + DD;
      // Each thread packs the starting columns its own items read, so no barrier is needed.
      for_each_share(split, [&](long bh, int c0, int c1) {
        float* P = starts.data() + bh * DD;
        pack(a.h0 + bh * DD, true, P, D, split.width, c0, c1);
        run_packed({{passes.dq(bh, a), P}}, c0, c1, split.width, vec, passes.gates(bh, a.g, gate_buf));
        passes.reverse(bh, a, G, P, gate_buf, c0, c1, split.width, vec);
      });
    }
  }
  if (gated(p.decay)) gate_gradient(p, a, allocator);
}

}  // namespace lattn::cpu
