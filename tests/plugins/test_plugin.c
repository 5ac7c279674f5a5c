/* Plugins that misbehave on purpose, one per VARIANT (tests/CMakeLists.txt builds each), for
   tests/plugins/test_plugins.cpp: what lattnbench must refuse at load time (another ABI, no entry point,
   a malformed or duplicate name), and what must fail a case without stopping the run (a wrong
   result, an error returned, scratch left allocated, a crash under --isolate); and version 2's side
   of the contract (VARIANT_v2: every rule's case fields and tensors; VARIANT_v2dplr: rule dplr's
   forward computed from them; VARIANT_abi2: a lattn_plugin_v2 of another ABI). <lattn/plugin_v2.h>
   includes version 1's header, whose declarations the version 1 variants are built against. */
#include <lattn/plugin_v2.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Declines one length, so that a test sees a plugin's own reason recorded as the skip reason. */
static const char* runs_everything(const lattn_case* c) {
  return c->seq == 13 ? "test plugins decline seq 13" : NULL;
}

/* Writes zeros: every output's rel_err is 1. */
static int zeros(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                 void** saved, char* err, size_t errlen) {
  (void)alloc, (void)stream, (void)err, (void)errlen;
  memset(t->o, 0, (size_t)(c->batch * c->heads * c->seq * c->dim) * sizeof(float));
  memset(t->hT, 0, (size_t)(c->batch * c->heads * c->dim * c->dim) * sizeof(float));
  *saved = NULL;
  return 0;
}

static int refuses(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                   void** saved, char* err, size_t errlen) {
  (void)c, (void)t, (void)alloc, (void)stream, (void)saved;
  snprintf(err, errlen, "test_fail refuses seq %lld on purpose", (long long)c->seq);
  return 7;
}

static int leaks(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                 void** saved, char* err, size_t errlen) {
  zeros(c, t, alloc, stream, saved, err, errlen);
  return alloc->allocate(alloc->ctx, 4096) ? 0 : 1;
}

/* abort(), not a stray pointer: AddressSanitizer (scripts/test.sh's second build) turns a SIGSEGV
   into a report and exit status 1, but leaves SIGABRT to kill the process. */
static int crashes(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                   void** saved, char* err, size_t errlen) {
  (void)c, (void)t, (void)alloc, (void)stream, (void)saved, (void)err, (void)errlen;
  abort();
}

/* Holds lattnbench to its side of the contract, returning what it broke as the error: the forward
   sees no cotangent or gradient, the backward gets every tensor and the forward's saved pointer,
   scratch is 256-byte aligned, the case's scale, threads and gamma are set. Writes zeros. */
#define EXPECT(cond)                                               \
  do {                                                             \
    if (!(cond)) {                                                 \
      snprintf(err, errlen, "contract broken: %s", #cond);         \
      return 1;                                                    \
    }                                                              \
  } while (0)

static int checks_forward(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                          void** saved, char* err, size_t errlen) {
  EXPECT(t->dO == NULL && t->dhT == NULL && t->dq == NULL && t->dk == NULL && t->dv == NULL && t->dh0 == NULL);
  EXPECT(t->q && t->k && t->v && t->h0 && t->o && t->hT && stream == NULL);
  EXPECT((t->gamma != NULL) == (strcmp(c->decay, "retnet") == 0));
  EXPECT(c->threads > 0 && c->scale * c->scale * (double)c->dim > 0.999999 && c->scale * c->scale * (double)c->dim < 1.000001);
  zeros(c, t, alloc, stream, saved, err, errlen);
  *saved = NULL;
  if (strcmp(c->mode, "fwd_bwd") == 0) {
    unsigned char* block = alloc->allocate(alloc->ctx, 100);
    EXPECT(block != NULL && (size_t)block % 256 == 0);
    block[0] = 42;
    *saved = block;
  }
  return 0;
}

static int checks_backward(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc, void* stream,
                           void* saved, char* err, size_t errlen) {
  (void)stream;
  EXPECT(t->dO && t->dhT && t->dq && t->dk && t->dv && t->dh0 && t->q && t->o && t->hT);
  EXPECT(saved != NULL && ((unsigned char*)saved)[0] == 42);
  alloc->deallocate(alloc->ctx, saved, 100);
  memset(t->dq, 0, (size_t)(c->batch * c->heads * c->seq * c->dim) * sizeof(float));
  return 0;
}

/* Version 2: holds lattnbench to what it hands a version 2 impl for each rule (the case's householder,
   bonus and mimo_rank; a, b for dplr; dt, trap and scale 1 for trapezoidal; u for the bonus; the
   new gradients in the backward only), returning what it broke as the error. Writes zeros. */
static size_t token_rows(const lattn_case2* c) {
  return (size_t)(c->batch * c->heads * c->seq * (c->mimo_rank > 1 ? c->mimo_rank : 1) * c->dim);
}

static int checks_v2_case(const lattn_case2* c, const lattn_tensors2* t, int backward, char* err, size_t errlen) {
  const int dplr = strcmp(c->rule, "dplr") == 0, trapezoidal = strcmp(c->rule, "trapezoidal") == 0;
  EXPECT(c->householder >= 1 && c->mimo_rank >= 1 && (c->bonus == 0 || c->bonus == 1));
  EXPECT(c->householder == 1 || strcmp(c->rule, "delta") == 0);
  EXPECT(c->mimo_rank == 1 || trapezoidal);
  EXPECT((t->a != NULL) == dplr && (t->b != NULL) == dplr);
  EXPECT((t->dt != NULL) == trapezoidal && (t->trap != NULL) == trapezoidal);
  EXPECT((t->u != NULL) == (c->bonus == 1));
  EXPECT((t->beta != NULL) == (strcmp(c->rule, "delta") == 0));
  if (trapezoidal) EXPECT(c->scale == 1.0);
  else EXPECT(c->scale * c->scale * (double)c->dim > 0.999999 && c->scale * c->scale * (double)c->dim < 1.000001);
  if (!backward) {
    EXPECT(t->da == NULL && t->db == NULL && t->du == NULL && t->ddt == NULL && t->dtrap == NULL && t->dO == NULL);
  } else {
    EXPECT(t->dO && t->dq && t->dk && t->dv && t->dh0);
    EXPECT((t->da != NULL) == dplr && (t->db != NULL) == dplr);
    EXPECT((t->ddt != NULL) == trapezoidal && (t->dtrap != NULL) == trapezoidal);
    EXPECT((t->du != NULL) == (c->bonus == 1));
  }
  return 0;
}

static int checks_v2_forward(const lattn_case2* c, const lattn_tensors2* t, const lattn_allocator* alloc, void* stream,
                             void** saved, char* err, size_t errlen) {
  (void)alloc, (void)stream;
  if (checks_v2_case(c, t, 0, err, errlen)) return 1;
  memset(t->o, 0, token_rows(c) * sizeof(float));
  memset(t->hT, 0, (size_t)(c->batch * c->heads * c->dim * c->dim) * sizeof(float));
  *saved = NULL;
  return 0;
}

static int checks_v2_backward(const lattn_case2* c, const lattn_tensors2* t, const lattn_allocator* alloc,
                              void* stream, void* saved, char* err, size_t errlen) {
  (void)alloc, (void)stream, (void)saved;
  return checks_v2_case(c, t, 1, err, errlen);
}

/* Version 2, computed: rule dplr's forward (docs/spec.md section 1f) for every decay, so that a run
   checks what the tensors a, b and g hold against the float64 reference, not only that they are there. */
static const char* dplr_only(const lattn_case2* c) {
  if (strcmp(c->rule, "dplr") != 0) return "test_v2dplr computes rule dplr only";
  return strcmp(c->mode, "fwd") == 0 ? NULL : "test_v2dplr has a forward only";
}

static int dplr_forward(const lattn_case2* c, const lattn_tensors2* t, const lattn_allocator* alloc, void* stream,
                        void** saved, char* err, size_t errlen) {
  (void)stream;
  const int64_t D = c->dim, T = c->seq;
  float* state = alloc->allocate(alloc->ctx, (size_t)(D * D + D) * sizeof(float));
  if (!state) {
    snprintf(err, errlen, "no scratch");
    return 1;
  }
  float* read = state + D * D;
  const float *q = t->q, *k = t->k, *v = t->v;
  float* o = t->o;
  for (int64_t bh = 0; bh < c->batch * c->heads; ++bh) {
    memcpy(state, t->h0 + bh * D * D, (size_t)(D * D) * sizeof(float));
    for (int64_t s = 0; s < T; ++s) {
      const int64_t row = (bh * T + s) * D;
      for (int64_t j = 0; j < D; ++j) {
        read[j] = 0;
        for (int64_t i = 0; i < D; ++i) read[j] += state[i * D + j] * t->b[row + i];
      }
      for (int64_t i = 0; i < D; ++i) {
        float decay = 1;
        if (strcmp(c->decay, "vector") == 0) decay = expf(t->g[row + i]);
        else if (strcmp(c->decay, "scalar") == 0) decay = expf(t->g[bh * T + s]);
        else if (strcmp(c->decay, "retnet") == 0) decay = t->gamma[bh % c->heads];
        for (int64_t j = 0; j < D; ++j)
          state[i * D + j] = decay * state[i * D + j] + t->a[row + i] * read[j] + k[row + i] * v[row + j];
      }
      for (int64_t j = 0; j < D; ++j) {
        float sum = 0;
        for (int64_t i = 0; i < D; ++i) sum += state[i * D + j] * q[row + i];
        o[row + j] = (float)c->scale * sum;
      }
    }
    memcpy(t->hT + bh * D * D, state, (size_t)(D * D) * sizeof(float));
  }
  alloc->deallocate(alloc->ctx, state, (size_t)(D * D + D) * sizeof(float));
  *saved = NULL;
  (void)err, (void)errlen;
  return 0;
}

#if defined(VARIANT_v2dplr)
static const lattn_impl2 impls[] = {{"scan", "cpu", dplr_only, dplr_forward, NULL}};
static const lattn_plugin2 plugin = {LATTN_PLUGIN_ABI_V2, "test_v2dplr", 1, impls};
const lattn_plugin2* lattn_plugin_v2(void) { return &plugin; }
#define NO_ENTRY_POINT
#elif defined(VARIANT_v2)
static const lattn_impl2 impls[] = {{"checks", "cpu", NULL, checks_v2_forward, checks_v2_backward}};
static const lattn_plugin2 plugin = {LATTN_PLUGIN_ABI_V2, "test_v2", 1, impls};
const lattn_plugin2* lattn_plugin_v2(void) { return &plugin; }
#define NO_ENTRY_POINT
#elif defined(VARIANT_abi2)
static const lattn_impl2 impls[] = {{"checks", "cpu", NULL, checks_v2_forward, checks_v2_backward}};
static const lattn_plugin2 plugin = {LATTN_PLUGIN_ABI_V2 + 1, "test_abi2", 1, impls};
const lattn_plugin2* lattn_plugin_v2(void) { return &plugin; }
#define NO_ENTRY_POINT
#elif defined(VARIANT_contract)
static const lattn_impl impls[] = {{"checks", "cpu", NULL, checks_forward, checks_backward}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_contract", 1, impls};
#elif defined(VARIANT_wrong)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_wrong", 1, impls};
#elif defined(VARIANT_fail)
static const lattn_impl impls[] = {{"refuses", "cpu", runs_everything, refuses, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_fail", 1, impls};
#elif defined(VARIANT_leak)
static const lattn_impl impls[] = {{"leaks", "cpu", runs_everything, leaks, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_leak", 1, impls};
#elif defined(VARIANT_crash)
static const lattn_impl impls[] = {{"crashes", "cpu", runs_everything, crashes, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_crash", 1, impls};
#elif defined(VARIANT_abi)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI + 1, "test_abi", 1, impls};
#elif defined(VARIANT_badname)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "Test-Name", 1, impls};
#elif defined(VARIANT_dupimpl)
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL},
                                   {"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_dupimpl", 2, impls};
#elif defined(VARIANT_dupname)
/* The example plugin's name (examples/plugins/mine.c). */
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "mine", 1, impls};
#elif defined(VARIANT_nosymbol)
/* Exports another entry point than lattn_plugin_v1. */
static const lattn_impl impls[] = {{"zeros", "cpu", runs_everything, zeros, NULL}};
static const lattn_plugin plugin = {LATTN_PLUGIN_ABI, "test_nosymbol", 1, impls};
const lattn_plugin* lattn_plugin_v0(void) { return &plugin; }
#define NO_ENTRY_POINT
#else
#error "VARIANT_<name> is not set"
#endif

#ifndef NO_ENTRY_POINT
const lattn_plugin* lattn_plugin_v1(void) { return &plugin; }
#endif
