/* An example lattnbench plugin in plain C11 (docs/plugins.md): the recurrent (scan) form of causal
   linear attention, forward and backward (docs/spec.md section 1), for decay none and retnet with the
   additive rule, float32. Naive on purpose: one head after another on one thread, the state in
   the output hT (the forward) and in two D x D scratch matrices from the harness's allocator (the
   backward, counted as temp_mb). It declines, with a reason, what it does not do: gated decays,
   the delta rule, bfloat16.

   Build: see CMakeLists.txt beside this file. Run:
     lattnbench --plugin ./libmine.so --impl mine:scan,scan,chunked --seq 2048 */
#include <lattn/plugin.h>

#include <stdio.h>
#include <string.h>

static const char* mine_unsupported(const lattn_case* c) {
  if (strcmp(c->op, "linear_attention") != 0) return "only linear attention";
  if (strcmp(c->decay, "none") != 0 && strcmp(c->decay, "retnet") != 0)
    return "gated decays (scalar, vector) are not implemented";
  if (strcmp(c->rule, "additive") != 0) return "the delta rule is not implemented";
  if (strcmp(c->dtype, "float32") != 0) return "float32 only (no bfloat16)";
  return NULL;
}

/* gamma_h: 1 without decay, the harness's gamma[h] for retnet. */
static float decay_of(const lattn_case* c, const lattn_tensors* t, int64_t h) {
  return strcmp(c->decay, "retnet") == 0 ? t->gamma[h] : 1.0f;
}

static int mine_forward(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                        void** saved, char* err, size_t errlen) {
  (void)alloc, (void)stream, (void)err, (void)errlen;
  const int64_t T = c->seq, D = c->dim;
  const float s = (float)c->scale;
  for (int64_t bh = 0; bh < c->batch * c->heads; ++bh) {
    const float g = decay_of(c, t, bh % c->heads);
    const float* q = (const float*)t->q + bh * T * D;
    const float* k = (const float*)t->k + bh * T * D;
    const float* v = (const float*)t->v + bh * T * D;
    float* o = (float*)t->o + bh * T * D;
    float* S = t->hT + bh * D * D; /* the running state, S_T at the end */
    memcpy(S, t->h0 + bh * D * D, (size_t)(D * D) * sizeof(float));
    for (int64_t step = 0; step < T; ++step) {
      const float *qt = q + step * D, *kt = k + step * D, *vt = v + step * D;
      float* ot = o + step * D;
      for (int64_t j = 0; j < D; ++j) ot[j] = 0.0f;
      for (int64_t i = 0; i < D; ++i) {
        float* row = S + i * D;
        for (int64_t j = 0; j < D; ++j) {
          row[j] = g * row[j] + kt[i] * vt[j];
          ot[j] += s * row[j] * qt[i];
        }
      }
    }
  }
  *saved = NULL; /* the backward recomputes the states: nothing to keep */
  return 0;
}

static int mine_backward(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                         void* saved, char* err, size_t errlen) {
  (void)stream, (void)saved;
  const int64_t T = c->seq, D = c->dim;
  const float s = (float)c->scale;
  const size_t bytes = (size_t)(D * D) * sizeof(float);
  float* S = alloc->allocate(alloc->ctx, bytes);
  float* G = alloc->allocate(alloc->ctx, bytes);
  if (!S || !G) {
    if (S) alloc->deallocate(alloc->ctx, S, bytes);
    if (G) alloc->deallocate(alloc->ctx, G, bytes);
    snprintf(err, errlen, "mine: no scratch memory for two %lld x %lld states", (long long)D, (long long)D);
    return 1;
  }
  for (int64_t bh = 0; bh < c->batch * c->heads; ++bh) {
    const float g = decay_of(c, t, bh % c->heads);
    const int64_t at = bh * T * D;
    const float *q = (const float*)t->q + at, *k = (const float*)t->k + at, *v = (const float*)t->v + at;
    const float* dO = (const float*)t->dO + at;
    float *dq = (float*)t->dq + at, *dk = (float*)t->dk + at, *dv = (float*)t->dv + at;
    /* dq_t = s S_t do_t, with the forward recurrence run again. */
    memcpy(S, t->h0 + bh * D * D, bytes);
    for (int64_t step = 0; step < T; ++step) {
      const float *kt = k + step * D, *vt = v + step * D, *dot = dO + step * D;
      for (int64_t i = 0; i < D; ++i) {
        float* row = S + i * D;
        float acc = 0.0f;
        for (int64_t j = 0; j < D; ++j) {
          row[j] = g * row[j] + kt[i] * vt[j];
          acc += row[j] * dot[j];
        }
        dq[step * D + i] = s * acc;
      }
    }
    /* G_T = dhT + s q_T do_T^T, G_t = gamma G_{t+1} + s q_t do_t^T; dk_t = G_t v_t, dv_t = G_t^T k_t. */
    memcpy(G, t->dhT + bh * D * D, bytes);
    for (int64_t step = T - 1; step >= 0; --step) {
      const float *qt = q + step * D, *kt = k + step * D, *vt = v + step * D, *dot = dO + step * D;
      float *dkt = dk + step * D, *dvt = dv + step * D;
      for (int64_t j = 0; j < D; ++j) dvt[j] = 0.0f;
      for (int64_t i = 0; i < D; ++i) {
        float* row = G + i * D;
        float acc = 0.0f;
        for (int64_t j = 0; j < D; ++j) {
          row[j] = (step == T - 1 ? 1.0f : g) * row[j] + s * qt[i] * dot[j];
          acc += row[j] * vt[j];
          dvt[j] += row[j] * kt[i];
        }
        dkt[i] = acc;
      }
    }
    float* dh0 = t->dh0 + bh * D * D;
    for (int64_t e = 0; e < D * D; ++e) dh0[e] = g * G[e];
  }
  alloc->deallocate(alloc->ctx, S, bytes);
  alloc->deallocate(alloc->ctx, G, bytes);
  return 0;
}

static const lattn_impl mine_impls[] = {
    {"scan", "cpu", mine_unsupported, mine_forward, mine_backward},
};

static const lattn_plugin mine_plugin = {LATTN_PLUGIN_ABI, "mine", 1, mine_impls};

const lattn_plugin* lattn_plugin_v1(void) { return &mine_plugin; }
