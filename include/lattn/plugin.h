/* lattnbench's plugin interface, version 1 (docs/spec.md section 5; docs/plugins.md says how to write,
   build and run a plugin). A plugin is a shared library that exports lattn_plugin_v1; lattnbench
   loads it with --plugin PATH or the config key `plugins:`, and times, checks and reports its
   impls as NAME:IMPL beside its own. Version 1 never changes once released: a later version gets
   a new symbol, so a plugin built against this header keeps loading. */
#ifndef LATTN_PLUGIN_H
#define LATTN_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#define LATTN_PLUGIN_ABI 1

typedef struct lattn_allocator {          /* scratch memory, counted as temp_mb */
  void* ctx;
  void* (*allocate)(void* ctx, size_t bytes);   /* >= 256-byte aligned; NULL on failure */
  void (*deallocate)(void* ctx, void* ptr, size_t bytes);
} lattn_allocator;

typedef struct lattn_case {
  const char* op;        /* "linear_attention" (version 1 has no other) */
  const char* mode;      /* "fwd" | "fwd_bwd" */
  const char* decay;     /* "none" | "retnet" | "scalar" | "vector" */
  const char* rule;      /* "additive" | "delta" */
  const char* dtype;     /* "float32" | "bfloat16": q, k, v, o, dO, dq, dk, dv; states are float32 */
  const char* device;    /* "cpu" | "cuda" */
  int64_t batch, heads, seq, dim, chunk;
  double scale;          /* dim^-1/2 */
  int threads;           /* CPU threads the run allows; 0 on CUDA */
} lattn_case;

/* Row-major, contiguous, the layouts of sections 1 and 1b:
   q, k, v, o, dO, dq, dk, dv: [B][H][T][D]   h0, hT, dhT, dh0: [B][H][D][D] (float32)
   g, dg: [B][H][T] (scalar) or [B][H][T][D] (vector), float32   beta, dbeta: [B][H][T], float32
   gamma: [H] (retnet's gamma_h), float32.
   Host pointers on the CPU, device pointers on CUDA. What a case does not use is NULL; dO, dhT
   and the gradients are NULL in forward(). */
typedef struct lattn_tensors {
  const void *q, *k, *v;
  const float *h0, *g, *beta, *gamma;
  void* o;
  float* hT;
  const void* dO;
  const float* dhT;
  void *dq, *dk, *dv;
  float *dh0, *dg, *dbeta;
} lattn_tensors;

typedef struct lattn_impl {
  const char* name;      /* [a-z0-9_]+, unique in the plugin */
  const char* device;    /* "cpu" | "cuda" */
  /* NULL when the impl can run the case, else a static string saying why not. */
  const char* (*unsupported)(const lattn_case* c);
  /* The forward pass. stream: the cudaStream_t to launch on (CUDA), NULL on the CPU. It may hand
     what the backward needs to *saved (memory from alloc). 0 on success, else nonzero with a
     message in err (at most errlen bytes, NUL-terminated). */
  int (*forward)(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc,
                 void* stream, void** saved, char* err, size_t errlen);
  /* The backward pass (fwd_bwd), after forward, with forward's *saved, which it releases.
     NULL when the impl has no backward (fwd_bwd cases are then unsupported). */
  int (*backward)(const lattn_case* c, const lattn_tensors* t, const lattn_allocator* alloc,
                  void* stream, void* saved, char* err, size_t errlen);
} lattn_impl;

typedef struct lattn_plugin {
  int abi;               /* LATTN_PLUGIN_ABI */
  const char* name;      /* [a-z0-9_]+; its impls appear as NAME:IMPL */
  int impl_count;
  const lattn_impl* impls;
} lattn_plugin;

#ifdef __cplusplus
extern "C" {
#endif

/* The one symbol a plugin exports (extern "C" from C++). */
const lattn_plugin* lattn_plugin_v1(void);

#ifdef __cplusplus
}
#endif

#endif /* LATTN_PLUGIN_H */
