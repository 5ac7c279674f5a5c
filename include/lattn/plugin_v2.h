/* lattnbench's plugin interface, version 2 (docs/spec.md section 5; docs/plugins.md says how to write,
   build and run a plugin). Version 2 adds the rules past version 1's additive and delta rules: dplr
   (RWKV-7's diagonal plus low rank, docs/spec.md section 1f), trapezoidal (Mamba-3, section 1e, with
   its MIMO rank), the bonus of RWKV-6 (section 1g) and DeltaProduct's several writes per token
   (section 1h). A plugin exports lattn_plugin_v2 instead of lattn_plugin_v1; lattnbench loads
   either (a library that exports both is loaded through lattn_plugin_v2). Version 1
   (<lattn/plugin.h>, which this header includes for lattn_allocator) is unchanged: its plugins keep
   loading and are never handed a case that only version 2 can describe. Version 2 never changes
   once released either: a later version gets a new symbol.

   Each version 2 struct begins with its version 1 counterpart's fields, in the same order and of the
   same types, and adds its own after them. */
#ifndef LATTN_PLUGIN_V2_H
#define LATTN_PLUGIN_V2_H

#include <lattn/plugin.h>

#define LATTN_PLUGIN_ABI_V2 2

typedef struct lattn_case2 {
  /* version 1's lattn_case */
  const char* op;        /* "linear_attention" */
  const char* mode;      /* "fwd" | "fwd_bwd" */
  const char* decay;     /* "none" | "retnet" | "scalar" | "vector" */
  const char* rule;      /* "additive" | "delta" | "dplr" | "trapezoidal" */
  const char* dtype;     /* "float32" | "bfloat16": q, k, v, o, dO, dq, dk, dv; the rest float32 */
  const char* device;    /* "cpu" | "cuda" */
  int64_t batch, heads, seq, dim, chunk;
  double scale;          /* the output's scale: dim^-1/2, and 1 for rule trapezoidal (section 1e) */
  int threads;           /* CPU threads the run allows; 0 on CUDA */
  /* version 2 */
  int householder;       /* writes per token n (rule delta: DeltaProduct, section 1h); 1 otherwise */
  int bonus;             /* 1: RWKV-6's bonus u (rule additive, decay vector, section 1g); else 0 */
  int mimo_rank;         /* R, rows of q, k, v, o per token (rule trapezoidal, section 1e); 1 otherwise */
} lattn_case2;

/* Row-major, contiguous, version 1's layouts (square and dense, as in version 1: q/k heads = heads,
   the value dim = dim, no packed documents; lattnbench declines those cases for plugins), where
   R = mimo_rank and n = householder give a token more rows (at most one of them is above 1):
   q, o, dO, dq: [B][H][T][R][D]      k, v, dk, dv: [B][H][T n][R][D]   (R = n = 1: [B][H][T][D])
   beta, dbeta: [B][H][T n]           (rule delta: row t n + j is token t's write j, FLA's order)
   a, b, da, db: [B][H][T][D]         (rule dplr: the written and the read direction), float32
   u, du: [H][D]                      (bonus: one row per head, shared by every sequence), float32
   dt, trap, ddt, dtrap: [B][H][T]    (rule trapezoidal: step sizes, lambda's logits), float32
   g, dg as in version 1 (rule trapezoidal takes decay scalar only: g_t is the log-gate A dt_t).
   What a case does not use is NULL; dO, dhT and the gradients are NULL in forward(). */
typedef struct lattn_tensors2 {
  /* version 1's lattn_tensors */
  const void *q, *k, *v;
  const float *h0, *g, *beta, *gamma;
  void* o;
  float* hT;
  const void* dO;
  const float* dhT;
  void *dq, *dk, *dv;
  float *dh0, *dg, *dbeta;
  /* version 2: inputs, then their gradients */
  const float *a, *b, *u, *dt, *trap;
  float *da, *db, *du, *ddt, *dtrap;
} lattn_tensors2;

typedef struct lattn_impl2 {
  const char* name;      /* [a-z0-9_]+, unique in the plugin */
  const char* device;    /* "cpu" | "cuda" */
  /* NULL when the impl can run the case, else a static string saying why not. A version 2 impl
     sees every rule, householder, bonus and mimo_rank: it declines those it does not compute. */
  const char* (*unsupported)(const lattn_case2* c);
  int (*forward)(const lattn_case2* c, const lattn_tensors2* t, const lattn_allocator* alloc,
                 void* stream, void** saved, char* err, size_t errlen);
  /* NULL when the impl has no backward (fwd_bwd cases are then unsupported). */
  int (*backward)(const lattn_case2* c, const lattn_tensors2* t, const lattn_allocator* alloc,
                  void* stream, void* saved, char* err, size_t errlen);
} lattn_impl2;

typedef struct lattn_plugin2 {
  int abi;               /* LATTN_PLUGIN_ABI_V2 */
  const char* name;      /* [a-z0-9_]+; its impls appear as NAME:IMPL */
  int impl_count;
  const lattn_impl2* impls;
} lattn_plugin2;

#ifdef __cplusplus
extern "C" {
#endif

/* The one symbol a version 2 plugin exports (extern "C" from C++). */
const lattn_plugin2* lattn_plugin_v2(void);

#ifdef __cplusplus
}
#endif

#endif /* LATTN_PLUGIN_V2_H */
