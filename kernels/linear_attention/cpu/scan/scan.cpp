// Scan (recurrent) form on the CPU, float32, forward and backward, the additive rule with every
// decay (docs/spec.md section 1) and the shapes of section 1c: the `scan_columns` row of
// cpu/variants.cpp.
//
// Every pass is a run_scan_pass (cpu/scan/scan_pass.hpp) over the state of one slice (Problem::slice: a
// sequence, or a packed document, and a value head), S: Dk x Dv, rows the key channels. q and k
// rows are read in place from the slice's q/k head. Columns of a state are independent, so the
// work items are (unit, block of W state columns) (cpu/scan/scan_split.hpp): with at least as many
// units as threads, whole units are handed out dynamically; with fewer, each thread takes a
// contiguous range of items, so one unit's columns are split. One level of threading, no BLAS.
// Over 500 lines (past 650 with the bonus form): the forward, the three backward passes and their
// shared work split read best beside one another, and so do the bonus form's one-token shifts of
// the same passes, which reuse each pass's setup rather than copying it into a file of their own.
//
// Forward:  S_t = gamma S_{t-1} + k_t v_t^T, o_t = s S_t^T q_t; a unit is a slice, its blocks split
// the value columns, Dv.
// Backward, O(B*H*Dk*Dv) scratch and no per-token state, three passes that each read out along the
// state's columns (a read-out along rows would need a horizontal sum per row and token):
//   dq: P = S^T from h0^T forward,      P_t = gamma P_{t-1} + v_t k_t^T,        dq_t = s P_t^T do_t
//   dv: G from dhT in reverse,          G_t = gamma G_{t+1} + s q_t do_t^T,     dv_t = G_t^T k_t
//   dk: G^T from dhT^T in reverse,      G^T_t = gamma G^T_{t+1} + s do_t q_t^T, dk_t = G_t v_t
// and dh0 = gamma G_1. That is 16 Dk Dv flops per token and head where a fused reverse recurrence
// needs 14 plus a horizontal sum per row and token. P and G^T have Dv rows and Dk columns, G has
// Dk rows and Dv columns: block b of an item is key columns [b W, (b + 1) W) in the dq and dk
// passes and value columns [b W, (b + 1) W) in the dv pass (a block past either is empty there).
// dq and dk of a q/k head are sums over the value heads it serves, so a backward unit is a group,
// those value heads of one sequence, which one thread walks a tile of tokens at a time, one head
// after another: the tile's q and k rows come from memory once for all of them, each head's dq and
// dk contributions go to a tile buffer of its own, and their sums are written once per tile (no
// two threads write the same rows and columns).
//
// A pass holds its state packed by column blocks: block [c, c + w) as a rows x w matrix at offset
// c * rows. Unpacked, a block's rows are Dv * 4 bytes apart; at 128 that is 512 bytes, so the
// block's 256 cache lines fall into 16 of L1's 64 sets and evict each other (measured: 51
// GFLOP/s on one core at D = 128 against 83 at D = 32, then ~80 packed). Packed, the 16 KiB block
// stays in L1.
// Scratch: forward, one packed Dk x Dv per thread; backward, one per slice (h0^T, then dhT^T) and
// one per value head of a group per thread (G), and with grouped heads a tile x Dk buffer per value
// head of a group per thread.
//
// Gated decays (docs/spec.md section 1b) change only the factor each step scales the state by: exp(g_t)
// (scalar gates), or exp(g_t) per key channel (vector gates: the rows of S and G, the columns of
// S^T and G^T). The reverse recurrences decay by the gate of the token after, G_t = A_{t+1} G_{t+1}
// + s q_t do_t^T, and dh0 = A_0 G_0. The exponentials are taken once per token tile into a buffer
// of (tile + 1) x width floats per thread, which every column block and both reverse passes read;
// no pass makes a sweep of its own over the gates. dg comes after the passes, from the identity
//   dg_t = rowsum(dh0 . h0) - sum_{tau < t} X_tau,  X_tau = q_tau . dq_tau - k_tau . dk_tau
// (per key channel for vector gates, summed over them for scalar gates; docs/kernels.md derives
// it), summed in double, Dk doubles per thread. dq and dk there are the value head's own
// contributions: with one value head per q/k head they are the outputs; with groups each tile's
// flush, which sums the heads' tile buffers into dq and dk, leaves each head's X_tau in its dg for
// the final sums (so with scalar gates, whose X_tau sums every key channel, a backward item is a
// whole group).
//
// The bonus form (RWKV-6, docs/spec.md section 1g; vector gates) is the same passes shifted by one
// token, since o_t reads S_{t-1}: the forward writes token t and reads for token t + 1 (o_0 reads h0,
// and token T-1 is written after the pass); the dq pass likewise (dq_0 = s h0 do_0); the reverse
// passes read token t after adding token t + 1's s q do^T (G_t = A_{t+1} G_{t+1} + s q_{t+1}
// do_{t+1}^T, G_{T-1} = dhT read before the pass), and dh0 = A_0 G_0 + s q_0 do_0^T. dg's identity
// becomes dg_t = rowsum(dh0 . h0) - sum_{tau <= t} q_tau . dq_tau + sum_{tau < t} k_tau . dk_tau over
// the passes' dq and dk (the bonus's own terms cancel there), so with grouped heads the dk flush
// leaves its X one row later. The bonus's O(T D) terms (o, dq, dk, dv and du) are added last.
#include <omp.h>

#include <algorithm>
#include <initializer_list>

#include "kernels/cpu/exp.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"
#include "kernels/linear_attention/cpu/scan/scan.hpp"
#include "kernels/linear_attention/cpu/scan/scan_pass.hpp"
#include "kernels/linear_attention/cpu/scan/scan_split.hpp"

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

// Packs columns [c0, c1) of a rows x cols matrix (src [rows][cols], or with `transposed` the
// transpose of src [cols][rows]) into the block layout above.
void pack(const float* src, bool transposed, float* buf, int rows, int cols, int W, int c0, int c1) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, cols - c);
    float* blk = buf + std::size_t(c) * rows;
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < w; ++j)
        blk[std::size_t(i) * w + j] =
            transposed ? src[std::size_t(c + j) * rows + i] : src[std::size_t(i) * cols + c + j];
  }
}

// dst [rows][cols] = scale * buf, row i also times row_scale[i * row_step] when row_scale is given.
void unpack(const float* buf, float* dst, float scale, int rows, int cols, int W, int c0, int c1,
            const float* row_scale = nullptr, int row_step = 0) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, cols - c);
    const float* blk = buf + std::size_t(c) * rows;
    for (int i = 0; i < rows; ++i) {
      const float f = row_scale ? scale * row_scale[std::size_t(i) * row_step] : scale;
      for (int j = 0; j < w; ++j) dst[std::size_t(i) * cols + c + j] = f * blk[std::size_t(i) * w + j];
    }
  }
}

// The gates of one slice, for run_packed: exp(g) of each tile's tokens and of the one after it (the
// reverse passes decay by the next token's gate) go to `buf` before the tile's passes run.
struct TileGates {
  const float* g = nullptr;  // this slice's log-gates, [T][width]; null: not gated
  int width = 0;             // per token: Dk (vector gates) or 1 (scalar)
  float* buf = nullptr;      // (tile + 1) x width floats of this thread
};

void take_gates(const TileGates& gates, int t0, int tokens) {
  const float* __restrict g = gates.g + std::size_t(t0) * gates.width;
  float* __restrict out = gates.buf;
  const int n = tokens * gates.width;
#pragma omp simd
  for (int e = 0; e < n; ++e) out[e] = exp_nonpositive(g[e]);
}

// One pass of run_packed: its packed state (S unset in the pass), its columns [c0, c1) and its
// slice's gates, whose exponentials it takes for each tile when `take` is set (a pass after it
// that reads the same gates leaves it unset). With `tile_out`, a tile's outputs go there (token t0
// of the tile at row 0, col_step apart) instead of to pass.out.
struct Packed {
  ScanPass pass;
  float* state;
  int c0, c1;
  float* tile_out = nullptr;
  TileGates gates = {};
  bool take = true;
};

// Runs passes make(0) .. make(count - 1) (their T and direction the same) on their columns, a tile
// of tokens at a time: within a tile, every block of the first pass, then every block of the
// second, and so on; then flush(t0, n) for the tile's tokens [t0, t0 + n). Passes that walk the
// same tokens in the same direction (dv and dk, and those of value heads sharing q and k) then
// read each tile's token rows from memory once between them, and several column blocks of one
// head read them from L2. Gated passes always go by tiles (the gates' buffer holds one).
template <class Make, class Flush>
void run_packed(int count, Make&& make, int W, Vec vec, Flush&& flush) {
  const Packed first = make(0);
  const int T = first.pass.T;
  bool tiled = count > 1;
  for (int i = 0; i < count; ++i) {
    const Packed p = make(i);
    tiled = tiled || p.gates.g || p.c1 - p.c0 > W || p.tile_out;
  }
  const int tile = tiled ? tile_tokens(vec) : T;
  for (int done = 0; done < T; done += tile) {
    const int n = std::min(tile, T - done);
    const int t0 = first.pass.reverse ? T - done - n : done;  // first token of the tile
    for (int i = 0; i < count; ++i) {
      const Packed p = make(i);
      if (p.gates.g && p.take) take_gates(p.gates, t0, std::min(n + 1, T - t0));
      ScanPass sub = p.pass;
      sub.T = n;
      sub.upd_row += std::size_t(t0) * sub.row_step;
      sub.read_row += std::size_t(t0) * sub.row_step;
      sub.upd_col += std::size_t(t0) * sub.col_step;
      sub.out = p.tile_out ? p.tile_out : sub.out + std::size_t(t0) * sub.col_step;
      sub.stream_out = sub.stream_out && !p.tile_out;
      sub.decay_first = p.pass.decay_first || done > 0;
      sub.gate = p.gates.g ? p.gates.buf : nullptr;
      for (int c = p.c0; c < p.c1; c += W) {
        sub.S = p.state + std::size_t(c) * sub.rows;
        sub.ld = std::min(W, p.c1 - c);  // the packed block's width: c1 is a block boundary or the last column
        sub.s_col0 = c;
        sub.prefetch_next_rows = c == p.c0 && scan_prefetch_rows(vec);
        run_scan_pass(sub, c, std::min(p.c1, c + W), vec);
      }
    }
    flush(t0, n);
  }
}

const auto no_flush = [](int, int) {};

// y[c0, c1) = scale * S^T r for a packed state of `rows` rows (the block layout above): a pass's
// readout of one token, taken outside the pass (the bonus form's first or last token).
void read_packed(const float* buf, int rows, int cols, int W, int c0, int c1, const float* r, float scale, float* y) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, cols - c);
    const float* blk = buf + std::size_t(c) * rows;
    float* __restrict out = y + c;
    std::fill_n(out, w, 0.0f);
    for (int i = 0; i < rows; ++i) {
      const float x = r[i];
      const float* __restrict row = blk + std::size_t(i) * w;
#pragma omp simd
      for (int j = 0; j < w; ++j) out[j] += x * row[j];
    }
    for (int j = 0; j < w; ++j) out[j] *= scale;
  }
}

// S <- diag(a) S + b c^T on columns [c0, c1) of a packed state (a: per row, the vector gates'
// exp(g) on S's rows): the bonus form's last write, after the pass.
void write_packed(float* buf, int rows, int cols, int W, int c0, int c1, const float* a, const float* b,
                  const float* cvec) {
  for (int c = c0; c < c1; c += W) {
    const int w = std::min(W, cols - c);
    float* blk = buf + std::size_t(c) * rows;
    for (int i = 0; i < rows; ++i) {
      float* __restrict row = blk + std::size_t(i) * w;
      const float* __restrict cc = cvec + c;
      const float ai = a[i], bi = b[i];
#pragma omp simd
      for (int j = 0; j < w; ++j) row[j] = ai * row[j] + bi * cc[j];
    }
  }
}

// A pass shifted for the bonus form: its readouts one token later (forward, dq), or its updates one
// token later (the reverse passes, whose gate is then the updating token's: the tile gates start a
// token later with no gate_shift), over T - 1 steps.
ScanPass read_later(ScanPass pass) {
  pass.T -= 1;
  pass.read_row += pass.row_step;
  pass.out += pass.col_step;
  return pass;
}
ScanPass update_later(ScanPass pass) {
  pass.T -= 1;
  pass.upd_row += pass.row_step;
  pass.upd_col += pass.col_step;
  pass.decay_first = true;
  pass.gate_shift = 0;
  return pass;
}

}  // namespace

int head_parallel_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.heads_total()));
}

namespace {

int slice_parallel_threads(const Problem& p) {
  return int(std::min<std::size_t>(std::size_t(omp_get_max_threads()), p.slices()));
}

// Forward items: (slice, block of value columns).
Split forward_split(const Problem& p, int W) { return scan_split(p, 1, column_blocks(p.value_dim(), W)); }

// Backward items: (group, block of key and value columns); a whole group where scalar gates' X
// sums over every key channel of grouped heads (this file's header).
Split backward_split(const Problem& p, int W) {
  const bool whole = p.group() > 1 && p.decay == Decay::scalar;
  return scan_split(p, p.group(),
                    whole ? 1 : std::max(column_blocks(p.dim, W), column_blocks(p.value_dim(), W)));
}

// The columns of the backward's blocks [b0, b1) (one block: all of them).
Columns backward_columns(const Split& split, int b0, int b1, int W, int columns) {
  return split.blocks == 1 ? Columns{0, columns} : block_columns(b0, b1, W, columns);
}

// A thread's buffers of grouped heads' dq and dk tiles: tile x Dk per value head of a group; none
// with one value head per q/k head.
std::size_t tile_floats(const Problem& p) { return std::size_t(tile_tokens(active_vec())) * p.dim; }
std::size_t group_tile_floats(const Problem& p) {
  return p.group() > 1 ? std::size_t(p.group()) * tile_floats(p) : 0;
}

}  // namespace

int scan_threads(const Problem& p) { return forward_split(p, scan_column_block(active_vec())).threads; }

// A thread's gate buffer (TileGates), 0 without gates.
std::size_t gate_tile_floats(const Problem& p) {
  return gated(p.decay) ? std::size_t(tile_tokens(active_vec()) + 1) * p.gate_width() : 0;
}

std::size_t scan_columns_forward_floats(const Problem& p) {
  return std::size_t(scan_threads(p)) * (p.head_state_elems() + gate_tile_floats(p));
}

// The gated backward's dg sums: Dk doubles per thread of its own loop (after the passes' scratch
// is freed).
std::size_t gate_gradient_floats(const Problem& p) {
  return gated(p.decay) ? std::size_t(slice_parallel_threads(p)) * 2 * p.dim : 0;
}

std::size_t scan_columns_backward_floats(const Problem& p) {
  const Split split = backward_split(p, scan_column_block(active_vec()));
  const std::size_t passes =
      p.slices() * p.head_state_elems() +
      std::size_t(split.threads) *
          (std::size_t(p.group()) * p.head_state_elems() + gate_tile_floats(p) + group_tile_floats(p));
  return std::max(passes, gate_gradient_floats(p));
}

namespace {

// The passes of one slice of the kernels below (the mathematics in this file's header).
struct SlicePasses {
  const Problem& p;
  float s;  // the attention scale

  // A pass whose state's rows are the key channels (S, G: row operands are q/k rows, column
  // operands and outputs value rows), or with `transposed` the value channels (S^T, G^T).
  ScanPass pass(const HeadSlice& h, bool transposed, const float* upd_row, const float* upd_col,
                const float* read_row, float* out) const {
    const int Dk = p.dim, Dv = p.value_dim();
    const std::size_t row_at = transposed ? h.value : h.key, col_at = transposed ? h.key : h.value;
    ScanPass pass;
    pass.T = h.seq;
    pass.rows = transposed ? Dv : Dk;
    pass.row_step = pass.rows;
    pass.col_step = transposed ? Dk : Dv;
    pass.upd_row = upd_row + row_at;
    pass.upd_col = upd_col + col_at;
    pass.read_row = read_row + row_at;
    pass.out = out + col_at;
    pass.gamma = float(decay_gamma(p.decay, h.head));
    pass.stream_out = true;
    pass.gate_stride = p.gate_width();
    // A pass over S or G scales their rows by vector gates; one over S^T or G^T, their columns.
    pass.gate_scale = p.decay == Decay::scalar ? GateScale::scalar
                      : transposed             ? GateScale::columns
                                               : GateScale::rows;
    return pass;
  }
  TileGates gates(const HeadSlice& h, const float* g, float* buf) const {
    if (!g) return {};
    return {g + h.gate, p.gate_width(), buf};
  }
  ScanPass forward(const HeadSlice& h, const ForwardArgs<float>& a) const {
    ScanPass o = pass(h, false, a.k, a.v, a.q, a.o);
    o.out_scale = s;
    return o;
  }
  ScanPass dq(const HeadSlice& h, const BackwardArgs<float>& a) const {
    ScanPass dq = pass(h, true, a.v, a.k, a.dO, a.dq);
    dq.out_scale = s;
    return dq;
  }
  ScanPass dv(const HeadSlice& h, const BackwardArgs<float>& a) const {
    ScanPass dv = pass(h, false, a.q, a.dO, a.k, a.dv);
    dv.upd_scale = s;
    dv.decay_first = false;
    dv.reverse = true;
    dv.gate_shift = 1;
    return dv;
  }
  ScanPass dk(const HeadSlice& h, const BackwardArgs<float>& a) const {
    ScanPass dk = pass(h, true, a.dO, a.q, a.v, a.dk);
    dk.upd_scale = s;
    dk.decay_first = false;
    dk.reverse = true;
    dk.gate_shift = 1;
    return dk;
  }
};

// Writes a tile of a group's dq or dk (tokens [t0, t0 + n), key columns [c0, c1)): the sum of its
// value heads' contributions in the tile buffers. With gates, leaves sign * (q or k) . contribution
// of each value head in its dg, per key channel (vector gates) or summed (scalar gates, whose items
// are whole groups): X_t of this file's header, dq's part first.
struct GroupFlush {
  const Problem& p;
  std::size_t first_slice;  // the group's first value head
  const float* tiles;       // its tile buffer, the next value head's tile_floats(p) after
  float* out;               // dq or dk at the group's q/k rows
  const float* keys;        // q or k there
  float* dg;                // a.dg, or null
  float sign;               // +1 for dq, -1 for dk
  bool first_x;             // dq's pass: dg's X starts here

  void operator()(int t0, int n, int c0, int c1) const {
    const int Dk = p.dim, group = p.group();
    const std::size_t stride = tile_floats(p);
    for (int u = 0; u < n; ++u) {
      const std::size_t r = std::size_t(t0 + u) * Dk;
      float* __restrict o = out + r;
      const float* __restrict y0 = tiles + std::size_t(u) * Dk;
      std::copy(y0 + c0, y0 + c1, o + c0);
      for (int m = 1; m < group; ++m) {
        const float* __restrict y = y0 + m * stride;
#pragma omp simd
        for (int j = c0; j < c1; ++j) o[j] += y[j];
      }
      if (!dg) continue;
      const float* __restrict x = keys + r;
      for (int m = 0; m < group; ++m) {
        const float* __restrict y = y0 + m * stride;
        float* __restrict d = dg + p.slice(first_slice + m).gate;
        if (p.decay == Decay::vector) {
          float* __restrict dr = d + r;
          if (first_x) std::fill(dr + c0, dr + c1, 0.0f);
#pragma omp simd
          for (int j = c0; j < c1; ++j) dr[j] += sign * x[j] * y[j];
        } else {
          double sum = 0;
#pragma omp simd reduction(+ : sum)
          for (int j = c0; j < c1; ++j) sum += double(x[j]) * y[j];
          d[t0 + u] = float(first_x ? sign * sum : d[t0 + u] + sign * sum);
        }
      }
    }
  }
};

}  // namespace

namespace {

// o_t += s (q_t . (u . k_t)) v_t on value columns [c0, c1) of one slice (the bonus, section 1g).
void add_bonus_outputs(const Problem& p, const HeadSlice& h, const ForwardArgs<float>& a, float s, int c0, int c1) {
  const int Dk = p.dim, Dv = p.value_dim();
  const float* __restrict u = a.u + std::size_t(h.head) * Dk;
  for (int t = 0; t < h.seq; ++t) {
    const float *__restrict q = a.q + h.key + std::size_t(t) * Dk, *__restrict k = a.k + h.key + std::size_t(t) * Dk;
    float bonus = 0;
#pragma omp simd reduction(+ : bonus)
    for (int i = 0; i < Dk; ++i) bonus += q[i] * u[i] * k[i];
    const float* __restrict v = a.v + h.value + std::size_t(t) * Dv;
    float* __restrict o = a.o + h.value + std::size_t(t) * Dv;
    bonus *= s;
#pragma omp simd
    for (int j = c0; j < c1; ++j) o[j] += bonus * v[j];
  }
}

}  // namespace

void scan_columns_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator) {
  const int Dk = p.dim, Dv = p.value_dim();
  const Vec vec = active_vec();
  const int W = scan_column_block(vec);
  const Split split = forward_split(p, W);
  const SlicePasses passes{p, float(attention_scale(Dk))};
  const std::size_t per_thread = p.head_state_elems() + gate_tile_floats(p);
  Workspace<float> state(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
  {
    float* buf = state.data() + omp_get_thread_num() * per_thread;
    float* gate_buf = buf + p.head_state_elems();
    for_each_share(p, split, [&](long slice, int b0, int b1) {
      const HeadSlice h = p.slice(std::size_t(slice));
      const Columns v = block_columns(b0, b1, W, Dv);
      pack(a.h0 + h.state, false, buf, Dk, Dv, W, v.first, v.last);
      Packed forward{passes.forward(h, a), buf, v.first, v.last, nullptr, passes.gates(h, a.g, gate_buf)};
      if (p.bonus) {  // o_0 reads h0; the pass writes token t and reads for t + 1
        read_packed(buf, Dk, Dv, W, v.first, v.last, a.q + h.key, passes.s, a.o + h.value);
        forward.pass = read_later(forward.pass);
      }
      run_packed(1, [&](int) { return forward; }, W, vec, no_flush);
      if (p.bonus) {  // token T-1's write
        const std::size_t last = std::size_t(h.seq - 1);
        const TileGates tg = passes.gates(h, a.g, gate_buf);
        take_gates(tg, int(last), 1);
        write_packed(buf, Dk, Dv, W, v.first, v.last, gate_buf, a.k + h.key + last * Dk, a.v + h.value + last * Dv);
        add_bonus_outputs(p, h, a, passes.s, v.first, v.last);
      }
      unpack(buf, a.hT + h.state, 1.0f, Dk, Dv, W, v.first, v.last);
    });
  }
}

namespace {

// dg of every slice from dh0 and X_t (this file's header): from the finished dq and dk, or with
// grouped heads from dg itself, where the passes left X_t. One slice per thread.
void gate_gradient(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int Dk = p.dim, Dv = p.value_dim(), width = p.gate_width();
  const bool x_in_dg = p.group() > 1;
  Workspace<float> sums(allocator, gate_gradient_floats(p));
#pragma omp parallel num_threads(slice_parallel_threads(p))
  {
    double* __restrict acc = reinterpret_cast<double*>(sums.data() + std::size_t(omp_get_thread_num()) * 2 * Dk);
#pragma omp for schedule(dynamic, 1)
    for (long slice = 0; slice < long(p.slices()); ++slice) {
      const HeadSlice h = p.slice(std::size_t(slice));
      const int T = h.seq;
      const float *q = a.q + h.key, *k = a.k + h.key, *dq = a.dq + h.key, *dk = a.dk + h.key;
      const float *dh0 = a.dh0 + h.state, *h0 = a.h0 + h.state;
      float* dg = a.dg + h.gate;
      for (int i = 0; i < Dk; ++i) {
        double sum = 0;
        for (int j = 0; j < Dv; ++j) sum += double(dh0[std::size_t(i) * Dv + j]) * h0[std::size_t(i) * Dv + j];
        acc[i] = sum;
      }
      if (width == 1 && !p.bonus) {  // scalar gates (vector gates of Dk 1 too, but for the bonus form)
        double total = 0;
        for (int i = 0; i < Dk; ++i) total += acc[i];
        for (int t = 0; t < T; ++t) {
          const std::size_t r = std::size_t(t) * Dk;
          double step = 0;
          if (x_in_dg) step = dg[t];
          else
#pragma omp simd reduction(+ : step)
            for (int i = 0; i < Dk; ++i) step += double(q[r + i]) * dq[r + i] - double(k[r + i]) * dk[r + i];
          dg[t] = float(total);
          total -= step;
        }
      } else if (p.bonus) {  // dg_t = rowsum(dh0 . h0) - sum_{tau <= t} Z_tau (this file's header)
        for (int t = 0; t < T; ++t) {
          const std::size_t r = std::size_t(t) * Dk;
          if (x_in_dg)
#pragma omp simd
            for (int i = 0; i < Dk; ++i) {
              acc[i] -= dg[r + i];
              dg[r + i] = float(acc[i]);
            }
          else
#pragma omp simd
            for (int i = 0; i < Dk; ++i) {
              acc[i] -= double(q[r + i]) * dq[r + i] - (t > 0 ? double(k[r + i - Dk]) * dk[r + i - Dk] : 0.0);
              dg[r + i] = float(acc[i]);
            }
        }
      } else {
        for (int t = 0; t < T; ++t) {
          const std::size_t r = std::size_t(t) * Dk;
          if (x_in_dg)
#pragma omp simd
            for (int i = 0; i < Dk; ++i) {
              const double x = dg[r + i];
              dg[r + i] = float(acc[i]);
              acc[i] -= x;
            }
          else
#pragma omp simd
            for (int i = 0; i < Dk; ++i) {
              dg[r + i] = float(acc[i]);
              acc[i] -= double(q[r + i]) * dq[r + i] - double(k[r + i]) * dk[r + i];
            }
        }
      }
    }
  }
}

}  // namespace

namespace {

// The bonus form's one readout outside a pass for a group's value heads (the transposed states P(m),
// `rows` = Dv rows, key columns kc): y_m = scale P(m)^T r_m with r_m value head m's row `token` of
// `reads` (dO or v); their sum is the q/k head's row `token` of `out` (dq or dk, at the group's
// rows). With grouped heads and `dg` (dq's row 0), x_row . y_m goes to value head m's dg row: X of
// this file's header, which the dq flush writes for the other rows. tiles: the group's tile buffers
// (null for one value head per q/k head), free between the passes.
template <class States>
void read_group_rows(const Problem& p, std::size_t first, int group, States&& P, int rows, int W, Columns kc,
                     const float* reads, std::size_t token, float scale, float* out, float* tiles, const float* x_row,
                     float* dg) {
  const int Dk = p.dim, Dv = p.value_dim();
  float* row = out + token * Dk;
  float* y = tiles ? tiles : row;
  for (int m = 0; m < group; ++m) {
    const HeadSlice h = p.slice(first + m);
    read_packed(P(m), rows, Dk, W, kc.first, kc.last, reads + h.value + token * Dv, scale, y);
    if (!tiles) continue;
    for (int j = kc.first; j < kc.last; ++j) row[j] = m == 0 ? y[j] : row[j] + y[j];
    if (dg) {
      float* d = dg + h.gate + token * Dk;
      for (int j = kc.first; j < kc.last; ++j) d[j] = x_row[j] * y[j];
    }
  }
}

// The bonus's own gradient terms (docs/spec.md section 1g), added after the passes and dg: with
// c_t = s (do_t . v_t) per value head, dq_t += c_t (u . k_t) and dk_t += c_t (u . q_t) summed over the
// q/k head's value heads, dv_t += s (q_t . (u . k_t)) do_t; then du per value head, summed over its
// sequences and tokens in double (one head per thread: no shared sums).
void add_bonus_gradients(const Problem& p, const BackwardArgs<float>& a) {
  const int Dk = p.dim, Dv = p.value_dim(), group = p.group();
  const float s = float(attention_scale(Dk));
  const long groups = long(p.slices()) / group;
#pragma omp parallel for schedule(dynamic, 1)
  for (long unit = 0; unit < groups; ++unit) {
    const std::size_t first = std::size_t(unit) * group;
    const HeadSlice h0 = p.slice(first);
    for (int t = 0; t < h0.seq; ++t) {
      const std::size_t rk = h0.key + std::size_t(t) * Dk;
      const float *__restrict q = a.q + rk, *__restrict k = a.k + rk;
      float *__restrict dq = a.dq + rk, *__restrict dk = a.dk + rk;
      for (int m = 0; m < group; ++m) {
        const HeadSlice h = p.slice(first + m);
        const std::size_t rv = h.value + std::size_t(t) * Dv;
        const float* __restrict u = a.u + std::size_t(h.head) * Dk;
        const float *__restrict v = a.v + rv, *__restrict dO = a.dO + rv;
        float* __restrict dv = a.dv + rv;
        float c = 0, bonus = 0;
#pragma omp simd reduction(+ : c)
        for (int j = 0; j < Dv; ++j) c += dO[j] * v[j];
#pragma omp simd reduction(+ : bonus)
        for (int i = 0; i < Dk; ++i) bonus += q[i] * u[i] * k[i];
        c *= s;
        bonus *= s;
#pragma omp simd
        for (int j = 0; j < Dv; ++j) dv[j] += bonus * dO[j];
#pragma omp simd
        for (int i = 0; i < Dk; ++i) {
          dq[i] += c * u[i] * k[i];
          dk[i] += c * u[i] * q[i];
        }
      }
    }
  }
  constexpr int kBlock = 64;  // du's channels summed at once, in double on the stack
#pragma omp parallel for schedule(dynamic, 1)
  for (int head = 0; head < p.heads; ++head)
    for (int i0 = 0; i0 < Dk; i0 += kBlock) {
      const int w = std::min(kBlock, Dk - i0);
      double sum[kBlock] = {};
      for (int n = 0; n < p.sequences(); ++n) {
        const HeadSlice h = p.slice(std::size_t(n) * p.heads + head);
        for (int t = 0; t < h.seq; ++t) {
          const float *__restrict q = a.q + h.key + std::size_t(t) * Dk + i0, *__restrict k = a.k + h.key + std::size_t(t) * Dk + i0;
          const float *__restrict v = a.v + h.value + std::size_t(t) * Dv, *__restrict dO = a.dO + h.value + std::size_t(t) * Dv;
          float c = 0;
#pragma omp simd reduction(+ : c)
          for (int j = 0; j < Dv; ++j) c += dO[j] * v[j];
          c *= s;
          for (int i = 0; i < w; ++i) sum[i] += double(c) * q[i] * k[i];
        }
      }
      for (int i = 0; i < w; ++i) a.du[std::size_t(head) * Dk + i0 + i] = float(sum[i]);
    }
}

}  // namespace

void scan_columns_backward(const Problem& p, const BackwardArgs<float>& a, Allocator& allocator) {
  const int Dk = p.dim, Dv = p.value_dim(), group = p.group();
  const Vec vec = active_vec();
  const int W = scan_column_block(vec);
  const Split split = backward_split(p, W);
  const SlicePasses passes{p, float(attention_scale(Dk))};
  const std::size_t DD = p.head_state_elems(), tile_stride = tile_floats(p);
  {
    const std::size_t per_thread = group * DD + gate_tile_floats(p) + group_tile_floats(p);
    Workspace<float> starts(allocator, p.slices() * DD);
    Workspace<float> carried(allocator, std::size_t(split.threads) * per_thread);
#pragma omp parallel num_threads(split.threads)
    {
      float* carried_G = carried.data() + omp_get_thread_num() * per_thread;  // G of each value head
      float* gate_buf = carried_G + group * DD;
      float* tiles = group > 1 ? gate_buf + gate_tile_floats(p) : nullptr;
      // Each thread packs the starting columns its own items read, so no barrier is needed. The
      // value heads of a group walk each tile one after another, so that the tile's q and k rows
      // come from memory once, and their dq and dk go through the tile buffers, summed there.
      for_each_share(p, split, [&](long unit, int b0, int b1) {
        const Columns kc = backward_columns(split, b0, b1, W, Dk), vc = backward_columns(split, b0, b1, W, Dv);
        const std::size_t first = std::size_t(unit) * group;
        const auto P = [&](int m) { return starts.data() + (first + m) * DD; };  // P, then G^T
        const auto G = [&](int m) { return carried_G + std::size_t(m) * DD; };
        const auto tile = [&](int m) { return tiles ? tiles + m * tile_stride : nullptr; };
        const std::size_t key_at = p.slice(first).key;  // the group's q/k rows
        // dq on P = S^T from h0^T.
        for (int m = 0; m < group; ++m) pack(a.h0 + p.slice(first + m).state, true, P(m), Dv, Dk, W, kc.first, kc.last);
        // The bonus form: its passes one token shifted (this file's header), so the flushes' rows and
        // dg's X one row later, and the token left out of each read outside the pass.
        const std::size_t later = p.bonus ? std::size_t(Dk) : 0;
        const auto dg_later = [&](std::size_t rows) { return a.dg ? a.dg + rows : nullptr; };
        if (p.bonus)  // dq_0 = s h0 do_0, and q_0 . dq_0 into dg's row 0
          read_group_rows(p, first, group, [&](int m) { return P(m); }, Dv, W, kc, a.dO, 0, passes.s, a.dq + key_at,
                          tiles, a.q + key_at, a.dg);
        const GroupFlush dq_flush{p, first, tiles, a.dq + key_at + later, a.q + key_at + later, dg_later(later), 1.0f, true};
        run_packed(
            group,
            [&](int m) {
              const HeadSlice h = p.slice(first + m);
              const ScanPass dq = passes.dq(h, a);
              return Packed{p.bonus ? read_later(dq) : dq, P(m), kc.first, kc.last, tile(m), passes.gates(h, a.g, gate_buf)};
            },
            W, vec, [&](int t0, int n) { if (tiles) dq_flush(t0, n, kc.first, kc.last); });
        // dv on G and dk on G^T, from dhT, in reverse; dh0 = A_0 G_0.
        for (int m = 0; m < group; ++m) {
          const HeadSlice h = p.slice(first + m);
          pack(a.dhT + h.state, false, G(m), Dk, Dv, W, vc.first, vc.last);
          pack(a.dhT + h.state, true, P(m), Dv, Dk, W, kc.first, kc.last);
        }
        if (p.bonus) {  // token T-1 reads dhT: dv_{T-1} = dhT^T k_{T-1}, dk_{T-1} = dhT v_{T-1}
          const std::size_t last = std::size_t(p.slice(first).seq - 1);
          for (int m = 0; m < group; ++m) {
            const HeadSlice h = p.slice(first + m);
            read_packed(G(m), Dk, Dv, W, vc.first, vc.last, a.k + key_at + last * Dk, 1.0f, a.dv + h.value + last * Dv);
          }
          read_group_rows(p, first, group, [&](int m) { return P(m); }, Dv, W, kc, a.v, last, 1.0f, a.dk + key_at,
                          tiles, nullptr, nullptr);
        }
        const GroupFlush dk_flush{p, first, tiles, a.dk + key_at, a.k + key_at, dg_later(later), -1.0f, false};
        run_packed(
            2 * group,
            [&](int i) {
              const int m = i / 2;
              const HeadSlice h = p.slice(first + m);
              TileGates tg = passes.gates(h, a.g, gate_buf);
              if (p.bonus) tg.g += tg.width;  // the updating token's gates
              if (i % 2 == 0) {
                const ScanPass dv = passes.dv(h, a);
                return Packed{p.bonus ? update_later(dv) : dv, G(m), vc.first, vc.last, nullptr, tg};
              }
              const ScanPass dk = passes.dk(h, a);
              return Packed{p.bonus ? update_later(dk) : dk, P(m), kc.first, kc.last, tile(m), tg, false};
            },
            W, vec, [&](int t0, int n) { if (tiles) dk_flush(t0, n, kc.first, kc.last); });
        for (int m = 0; m < group; ++m) {
          const HeadSlice h = p.slice(first + m);
          const TileGates tg = passes.gates(h, a.g, gate_buf);
          if (tg.g) {
            take_gates(tg, 0, 1);  // A_0's factors
            unpack(G(m), a.dh0 + h.state, 1.0f, Dk, Dv, W, vc.first, vc.last, tg.buf, p.decay == Decay::vector ? 1 : 0);
          } else {
            unpack(G(m), a.dh0 + h.state, float(decay_gamma(p.decay, h.head)), Dk, Dv, W, vc.first, vc.last);
          }
          if (p.bonus) {  // + s q_0 do_0^T: o_0 reads h0
            const float* q0 = a.q + key_at;
            const float* __restrict do0 = a.dO + h.value;
            for (int i = 0; i < Dk; ++i) {
              float* __restrict row = a.dh0 + h.state + std::size_t(i) * Dv;
              const float x = passes.s * q0[i];
#pragma omp simd
              for (int j = vc.first; j < vc.last; ++j) row[j] += x * do0[j];
            }
          }
        }
      });
    }
  }
  if (gated(p.decay)) gate_gradient(p, a, allocator);
  if (p.bonus) add_bonus_gradients(p, a);
}

}  // namespace lattn::cpu
