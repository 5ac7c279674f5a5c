// The tiled chunked kernel's forward (the mathematics is in cpu/chunked/chunked_tiled.hpp's header and
// docs/spec.md section 1; what it shares with the backward is in cpu/chunked/chunked_tiled_parts.hpp).
//
// Per chunk of n rows, forward (S kept packed in panels for the whole head):
//   A    = (Q K^T) . M                    lower output: tiles above the diagonal are not computed
//   O    = s ( diag(lam) (Q S) + A V )    one accumulator, k of A V cut at the tile's last row
//   S    = gamma^n S + K^T (diag(gam) V)
// With grouped q/k heads the forward's items are (sequence, q/k head, part) (GradParts): the part's
// value heads walk the chunks side by side, Q K^T made once per chunk for all of them (masked once
// without decay; retnet masks it per head with its gamma), and the q/k rows read once.
#include <omp.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>

#include "kernels/linear_attention/cpu/chunked/chunked_tiled.hpp"
#include "kernels/linear_attention/cpu/chunked/chunked_tiled_parts.hpp"
#include "kernels/linear_attention/cpu/kernels.hpp"

namespace lattn::cpu {
namespace tiled {
namespace {

// A kept chunk state: S packed when split over chunks (the prefix runs on it), S^T panels otherwise.
std::size_t kept_state_floats(const Problem& p) {
  return split_chunks(p) ? key_state_floats(p) : value_state_floats(p);
}

// The value heads of the largest part (1 when unshared).
int shared_heads(const Problem& p) {
  if (!shares_scores(p)) return 1;
  const int parts = forward_parts(p).parts;
  return (p.group() + parts - 1) / parts;
}

// Shared: also the unmasked Q K^T (C x C), and per further value head a state and powers of gamma.
std::size_t forward_thread_floats(const Problem& p) {
  const std::size_t C = effective_chunk(p), Dk = p.dim, PV = panel_cols(p.value_dim()), PC = panel_cols(int(C));
  const std::size_t more = std::size_t(shared_heads(p) - 1), shared = shares_scores(p) ? C * C : 0;
  return 2 * C * C + Dk * PC + 2 * C * PV + key_state_floats(p) + 3 * C + 1 + shared +
         more * (key_state_floats(p) + C + 1);
}

}  // namespace
}  // namespace tiled

std::size_t chunked_tiled_kept_states_floats(const Problem& p) { return item_chunks(p) * tiled::kept_state_floats(p); }

// Split over chunks, the forward's chunk states live in the kept block when there is one.
std::size_t chunked_tiled_forward_floats(const Problem& p, bool keep) {
  const std::size_t SF = key_state_floats(p);
  const std::size_t chunk_states = keep ? 0 : std::size_t(p.chunks()) * SF;
  const std::size_t shared = tiled::split_chunks(p) ? chunk_states + SF : 0;
  return shared + std::size_t(tiled::tiled_threads(p)) * tiled::forward_thread_floats(p) +
         order_floats(p, tiled::forward_item_count(p));
}

#if defined(__AVX512F__)
namespace tiled {
namespace {

struct ForwardBuffers {
  float *mask, *A, *Ktp, *Vp, *Vg, *Sp, *pw, *lam, *gam;
  // Shared items: Q K^T unmasked, and the further value heads' states and powers of gamma.
  float *R = nullptr, *more_states = nullptr, *more_pw = nullptr;
};

ForwardBuffers forward_buffers(const Problem& p, float* base) {
  const int C = effective_chunk(p);
  Carver carve{base};
  ForwardBuffers b;
  b.mask = carve.take(std::size_t(C) * C);
  b.A = carve.take(std::size_t(C) * C);
  b.Ktp = carve.take(std::size_t(p.dim) * panel_cols(C));
  b.Vp = carve.take(std::size_t(C) * panel_cols(p.value_dim()));
  b.Vg = carve.take(std::size_t(C) * panel_cols(p.value_dim()));
  b.Sp = carve.take(key_state_floats(p));
  b.pw = carve.take(C + 1);
  b.lam = carve.take(C);
  b.gam = carve.take(C);
  if (shares_scores(p)) {
    const std::size_t more = std::size_t(shared_heads(p) - 1);
    b.R = carve.take(std::size_t(C) * C);
    b.more_states = carve.take(more * key_state_floats(p));
    b.more_pw = carve.take(more * (C + 1));
  }
  return b;
}

// O_c = s (diag(lam) Q_c S + ((Q_c K_c^T) . M) V_c) for the packed state S entering the chunk:
// Q K^T is n x Dk by Dk x n, Q S n x Dk by Dk x Dv, A V n x n by n x Dv. Returns V_c as the
// operand it used, for the state product to reuse.
// The scores into A, or (A null) Q K^T unmasked into R for a group's value heads to mask.
void chunk_scores(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Kc,
                  const NextRows& next, bool unmasked = false) {
  tile::pack(Kc, d.Dk, true, d.Dk, n, nullptr, b.Ktp);
  Product scores;
  scores.M = n;
  scores.N = n;
  scores.c = unmasked ? b.R : b.A;
  scores.ldc = d.C;
  scores.s1 = seg(Range::full, d.Dk, Qc, d.Dk, 1, b.Ktp);
  scores.mask = unmasked ? nullptr : b.mask;
  scores.ldm = d.C;
  scores.mask_all = decay;
  scores.lower = true;
  prefetch_into(scores, next.k, next.qk_floats);
  tile::run(scores);
}

// O_c from the scores A; returns V_c as the operand it used, for the state product to reuse.
Operand chunk_out(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Vc,
                  float* Oc, const float* Sp, const NextRows& next) {
  const Operand V = rows_operand(Vc, n, d.Dv, b.Vp);
  Product out;
  prefetch_into(out, next.v, next.v_floats);
  out.M = n;
  out.N = d.Dv;
  out.c = Oc;
  out.ldc = d.Dv;
  out.s1 = seg(Range::full, d.Dk, Qc, d.Dk, 1, Sp);
  out.rs = decay ? b.lam : nullptr;
  out.s2 = seg(Range::lower, n, b.A, d.C, 1, V.b, V.brs);
  out.alpha = float(attention_scale(d.Dk));
  tile::run(out);
  return V;
}

Operand chunk_output(const ForwardBuffers& b, const Dims& d, int n, bool decay, const float* Qc, const float* Kc,
                     const float* Vc, float* Oc, const float* Sp, const NextRows& next = {}) {
  chunk_scores(b, d, n, decay, Qc, Kc, next);
  return chunk_out(b, d, n, decay, Qc, Vc, Oc, Sp, next);
}

// A = R . M for a value head with powers pw of its gamma: M_ij = gamma^(i-j) on and below the
// diagonal, zero above it to the 8-row tile's end (the A V product reads that far; R's entries
// there may be unwritten).
void mask_scores(const ForwardBuffers& b, const Dims& d, int n, const float* pw) {
  for (int i = 0; i < n; ++i) {
    const float* __restrict r = b.R + std::size_t(i) * d.C;
    float* __restrict a = b.A + std::size_t(i) * d.C;
    for (int j = 0; j <= i; ++j) a[j] = r[j] * pw[i - j];
    std::fill(a + i + 1, a + std::min(n, i / tile::kMR * tile::kMR + tile::kMR), 0.0f);
  }
}

// keep: where S^T entering each chunk of every item goes (panels, item-major), or null.
// One shared item: value heads [h0, h1) of one sequence on their q/k head's rows, chunk by chunk:
// Q K^T once (masked once without decay, where every head's A is the same), then each head's
// output and state update. keep: as forward_items'.
void forward_shared_item(const Problem& p, const ForwardArgs<float>& a, const ForwardBuffers& b, float* keep,
                         int sequence, int h0, int h1) {
  const Dims d = dims_of(p);
  const std::size_t SF = value_state_floats(p), KSF = key_state_floats(p);
  const bool decay = p.decay == Decay::retnet;
  const auto state = [&](int h) { return h == h0 ? b.Sp : b.more_states + std::size_t(h - h0 - 1) * KSF; };
  const auto powers = [&](int h) { return h == h0 ? b.pw : b.more_pw + std::size_t(h - h0 - 1) * (d.C + 1); };
  const HeadSlice first = p.slice(std::size_t(sequence) * p.heads + h0);
  const float *q = a.q + first.key, *k = a.k + first.key;
  for (int h = h0; h < h1; ++h) {
    decay_tables(float(decay_gamma(p.decay, h)), d.C, powers(h), b.mask);  // mask: ones without decay
    tile::pack(a.h0 + p.slice(std::size_t(sequence) * p.heads + h).state, d.Dv, false, d.Dk, d.Dv, nullptr, state(h));
  }
  const int chunks = chunks_of(p, first.seq);
  for (int c = 0; c < chunks; ++c) {
    const auto [n, rk, rv] = chunk_rows(d, first.seq, c);
    NextRows next;
    if (c + 1 < chunks) {
      const auto [n1, rk1, rv1] = chunk_rows(d, first.seq, c + 1);
      next = {q + rk1, k + rk1, nullptr, nullptr, std::size_t(n1) * d.Dk, 0};
    }
    chunk_scores(b, d, n, false, q + rk, k + rk, next, decay);
    for (int h = h0; h < h1; ++h) {
      const std::size_t index = std::size_t(sequence) * p.heads + h;
      const HeadSlice sl = p.slice(index);
      const float* pw = powers(h);
      float* Sp = state(h);
      if (decay) mask_scores(b, d, n, pw);
      chunk_weights(pw, n, 1.0f, b.lam, b.gam);
      if (keep) tile::transpose_packed(Sp, d.Dk, d.Dv, keep + (item_chunk_offset(p, index) + c) * SF);
      // What this thread reads next: the next head's v rows of this chunk, or after the last head
      // the next chunk's q rows (its k rows went with the scores) and first head's v rows.
      const std::size_t head_rows = std::size_t(p.seq) * d.Dv;  // v's rows of one head
      NextRows after;
      if (h + 1 < h1) {
        after.v = a.v + sl.value + head_rows + rv;
        after.v_floats = std::size_t(n) * d.Dv;
      } else if (next.q) {
        after.q = next.q;
        after.qk_floats = next.qk_floats;
        after.v = a.v + first.value + rv + std::size_t(n) * d.Dv;
        after.v_floats = std::size_t(chunk_rows(d, first.seq, c + 1).n) * d.Dv;
      }
      const float* v = a.v + sl.value + rv;
      const Operand V = chunk_out(b, d, n, decay, q + rk, v, a.o + sl.value + rv, Sp, after);
      if (decay) state_product(Sp, d, n, k + rk, v, b.gam, 1.0f, pw[n], b.Vg, after.q, after.qk_floats);
      else state_product(Sp, d, n, k + rk, V, 1.0f, 1.0f, after.q, after.qk_floats);
    }
  }
  for (int h = h0; h < h1; ++h)
    tile::unpack(state(h), d.Dk, d.Dv, a.hT + p.slice(std::size_t(sequence) * p.heads + h).state, d.Dv);
}

// order: longest_first's list for a packed problem, or null.
void forward_items(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep, const int* order) {
  const Dims d = dims_of(p);
  const std::size_t SF = value_state_floats(p);
  const long items = long(p.slices());
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, scratch + omp_get_thread_num() * forward_thread_floats(p));
    if (shares_scores(p)) {
      forward_parts(p).for_items(p, order, [&](int sequence, int h0, int h1) {
        forward_shared_item(p, a, b, keep, sequence, h0, h1);
      });
    } else {
// Dynamic: a thread descheduled by another job does not hold the others at the end.
#pragma omp for schedule(dynamic, 1)
      for (long pick = 0; pick < items; ++pick) {
        const std::size_t item = item_at(order, pick);
        const auto [sl, gamma, decay] = item_head(p, item, d, b.pw, b.mask);
        const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value;
        float* o = a.o + sl.value;
        const int chunks = chunks_of(p, sl.seq);
        float* kept = keep ? keep + item_chunk_offset(p, item) * SF : nullptr;
        tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, b.Sp);
        for (int c = 0; c < chunks; ++c) {
          const auto [n, rk, rv] = chunk_rows(d, sl.seq, c);
          NextRows next;
          if (c + 1 < chunks) {
            const auto [n1, rk1, rv1] = chunk_rows(d, sl.seq, c + 1);
            next = {q + rk1, k + rk1, v + rv1, nullptr, std::size_t(n1) * d.Dk, std::size_t(n1) * d.Dv};
          }
          chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
          if (kept) tile::transpose_packed(b.Sp, d.Dk, d.Dv, kept + c * SF);
          const Operand V = chunk_output(b, d, n, decay, q + rk, k + rk, v + rv, o + rv, b.Sp, next);
          if (decay) state_product(b.Sp, d, n, k + rk, v + rv, b.gam, 1.0f, b.pw[n], b.Vg, next.q, next.qk_floats);
          else state_product(b.Sp, d, n, k + rk, V, 1.0f, b.pw[n], next.q, next.qk_floats);
        }
        tile::unpack(b.Sp, d.Dk, d.Dv, a.hT + sl.state, d.Dv);
      }
    }
  }
}

// One item at a time (dense problems only), chunks split over the threads: the intra-chunk work
// has no sequential dependency, and the states entering the chunks come from a prefix over the
// chunks' own contributions K_c^T diag(gam) V_c, an O(chunks * Dk * Dv) walk split over state
// elements. keep: where S entering each chunk of every item goes (packed, item-major), or null;
// the prefix then runs in place there.
void forward_chunk_split(const Problem& p, const ForwardArgs<float>& a, float* scratch, float* keep) {
  const Dims d = dims_of(p);
  const int chunks = p.chunks();
  const std::size_t SF = key_state_floats(p);
  const SplitBlocks blocks = split_blocks(scratch, chunks, SF, keep != nullptr);
  float *run = blocks.run, *own_states = blocks.own_states;
#pragma omp parallel num_threads(tiled_threads(p))
  {
    const ForwardBuffers b = forward_buffers(p, blocks.threads + omp_get_thread_num() * forward_thread_floats(p));
    const auto [e0, e1] = share(SF);
    for (std::size_t item = 0; item < p.slices(); ++item) {
      // Named, not bound: clang does not let the OpenMP constructs below read structured bindings.
      const ItemHead head = item_head(p, item, d, b.pw, b.mask);
      const HeadSlice& sl = head.sl;
      const bool decay = head.decay;
      const float *q = a.q + sl.key, *k = a.k + sl.key, *v = a.v + sl.value;
      float* o = a.o + sl.value;
      float* chunk_states = keep ? keep + item * chunks * SF : own_states;
#pragma omp single
      tile::pack(a.h0 + sl.state, d.Dv, false, d.Dk, d.Dv, nullptr, run);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        state_product(chunk_states + c * SF, d, n, k + rk, v + rv, decay ? b.gam : nullptr, 1.0f, 0.0f, b.Vg);
      }
      prefix_states(p, head.gamma, chunk_states, run, e0, e1, false);
#pragma omp barrier
#pragma omp single nowait
      tile::unpack(run, d.Dk, d.Dv, a.hT + sl.state, d.Dv);
#pragma omp for schedule(static)
      for (int c = 0; c < chunks; ++c) {
        const auto [n, rk, rv] = chunk_rows(d, p.seq, c);
        chunk_weights(b.pw, n, 1.0f, b.lam, b.gam);
        chunk_output(b, d, n, decay, q + rk, k + rk, v + rv, o + rv, chunk_states + c * SF);
      }
    }
  }
}

}  // namespace
}  // namespace tiled

void chunked_tiled_forward(const Problem& p, const ForwardArgs<float>& a, Allocator& allocator, float* keep) {
  const std::size_t total = chunked_tiled_forward_floats(p, keep != nullptr);
  Workspace<float> scratch(allocator, total);
  if (tiled::split_chunks(p)) return tiled::forward_chunk_split(p, a, scratch.data(), keep);
  int* order = tiled::order_list(scratch.data(), total, order_floats(p, tiled::forward_item_count(p)));
  longest_first(p, tiled::forward_item_count(p),
                tiled::shares_scores(p) ? tiled::forward_parts(p).per_sequence(p) : std::size_t(p.heads), order);
  tiled::forward_items(p, a, scratch.data(), keep, order);
}

#else
void chunked_tiled_forward(const Problem&, const ForwardArgs<float>&, Allocator&, float*) {
  throw std::logic_error("chunked_tiled_forward: built without AVX-512");
}
#endif

}  // namespace lattn::cpu
