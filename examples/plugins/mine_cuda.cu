// An example lattnbench plugin in CUDA (docs/plugins.md): the recurrent (scan) form of causal
// linear attention, forward only, float32, decay none and retnet (docs/spec.md section 1). One block per
// batch and head, one thread per column j of the value dim: thread j owns column j of the state,
// kept in the output hT, so no two threads touch one element and no barrier is needed; the loads
// of a row of S are coalesced across the block. Naive on purpose, like mine.c. Without a backward,
// lattnbench reports its fwd_bwd cases as skipped ("has no backward").
#include <cuda_runtime.h>
#include <lattn/plugin.h>

#include <cstdio>
#include <cstring>

namespace {

constexpr int kMaxDim = 1024;  // threads per block

__global__ void scan_forward_kernel(const float* q, const float* k, const float* v, const float* h0,
                                    const float* gamma, float* o, float* hT, int heads, int seq, int dim,
                                    float scale) {
  const long bh = blockIdx.x;
  const int j = threadIdx.x;
  if (j >= dim) return;
  const float g = gamma ? gamma[bh % heads] : 1.0f;
  const long tokens = bh * long(seq) * dim;
  float* S = hT + bh * long(dim) * dim;
  for (int i = 0; i < dim; ++i) S[long(i) * dim + j] = h0[bh * long(dim) * dim + long(i) * dim + j];
  for (int t = 0; t < seq; ++t) {
    const float* qt = q + tokens + long(t) * dim;
    const float* kt = k + tokens + long(t) * dim;
    const float vj = v[tokens + long(t) * dim + j];
    float acc = 0.0f;
    for (int i = 0; i < dim; ++i) {
      float& s = S[long(i) * dim + j];
      s = g * s + kt[i] * vj;
      acc += s * qt[i];
    }
    o[tokens + long(t) * dim + j] = scale * acc;
  }
}

const char* cuda_unsupported(const lattn_case* c) {
  if (std::strcmp(c->op, "linear_attention") != 0) return "only linear attention";
  if (std::strcmp(c->decay, "none") != 0 && std::strcmp(c->decay, "retnet") != 0)
    return "gated decays (scalar, vector) are not implemented";
  if (std::strcmp(c->rule, "additive") != 0) return "the delta rule is not implemented";
  if (std::strcmp(c->dtype, "float32") != 0) return "float32 only (no bfloat16)";
  if (c->dim > kMaxDim) return "dim above 1024 (one thread per column)";
  return nullptr;
}

int cuda_forward(const lattn_case* c, const lattn_tensors* t, const lattn_allocator*, void* stream, void** saved,
                 char* err, size_t errlen) {
  *saved = nullptr;
  const bool retnet = std::strcmp(c->decay, "retnet") == 0;
  const dim3 grid(unsigned(c->batch * c->heads)), block(unsigned(c->dim));
  cudaStream_t on = static_cast<cudaStream_t>(stream);
  scan_forward_kernel<<<grid, block, 0, on>>>(
      static_cast<const float*>(t->q), static_cast<const float*>(t->k), static_cast<const float*>(t->v), t->h0,
      retnet ? t->gamma : nullptr, static_cast<float*>(t->o), t->hT, int(c->heads), int(c->seq), int(c->dim),
      float(c->scale));
  if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    std::snprintf(err, errlen, "mine_cuda: launch failed: %s", cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

const lattn_impl cuda_impls[] = {{"scan", "cuda", cuda_unsupported, cuda_forward, nullptr}};
const lattn_plugin cuda_plugin = {LATTN_PLUGIN_ABI, "mine_cuda", 1, cuda_impls};

}  // namespace

extern "C" const lattn_plugin* lattn_plugin_v1(void) { return &cuda_plugin; }
