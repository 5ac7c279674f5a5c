// Stand-in for the CUDA toolkit's mma.h (nvcuda::wmma) at the documented level, not the hardware
// one: every lane's fragment holds the whole tile (the lane-to-element mapping is unspecified in
// CUDA, so code that is correct on a GPU cannot depend on it), mma_sync computes the lane's share
// of the result (what store_matrix_sync has that lane write), and every *_sync call must be made
// by all 32 lanes of the warp. load_matrix_sync and store_matrix_sync begin, as CUDA documents,
// by waiting until every lane of the warp has arrived (a rendezvous: what the lanes wrote before
// is visible to the load, what they read before is done before the store). mma_sync touches no
// memory, so its rendezvous could not change a result: each lane records its WMMA calls, and the
// lanes must agree on them when they next meet (lattn_emu::note_wmma_call). load_matrix_sync and store_matrix_sync
// check what CUDA requires of their arguments: a 256-bit (32-byte) aligned pointer and a leading
// dimension that is a multiple of 16 bytes; a violation fails the launch. store_matrix_sync has
// each lane write its own share of the tile (so that no two threads write one address), and
// mma_sync multiplies in float32 with float32 accumulation: bf16 products are exact in float32.
#pragma once

#include <cuda_bf16.h>
#include <math.h>

#include <cstdint>
#include <string>
#include <type_traits>

#include "lattn_emu/device.hpp"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K>
struct Shape;
template <int M, int N, int K>
struct Shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

inline float widen(float x) { return x; }
inline float widen(__nv_bfloat16 x) { return __bfloat162float(x); }
template <class T>
T narrow(float x) {
  if constexpr (std::is_same_v<T, float>)
    return x;
  else
    return __float2bfloat16_rn(x);
}

void check_pointer(const char* what, const void* ptr, unsigned ldm, std::size_t element_bytes);
// Every *_sync call is one all 32 lanes make (checked when they next meet); the loads and stores
// also wait there for the warp's other lanes.
inline void warp_call(const char* what) { lattn_emu::note_wmma_call(what); }
inline void warp_barrier(const char* what) {
  lattn_emu::note_wmma_call(what);
  lattn_emu::warp_exchange(what, 0xffffffffu, 0, -1);
}
}  // namespace detail

template <class Use, int M, int N, int K, class T, class Layout = void>
class fragment {
 public:
  using element_type = T;
  static constexpr int rows = detail::Shape<Use, M, N, K>::rows, cols = detail::Shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols;
  T x[num_elements];
};

template <class Use, int M, int N, int K, class T, class Layout>
void fill_fragment(fragment<Use, M, N, K, T, Layout>& f, float value) {
  for (auto& e : f.x) e = detail::narrow<T>(value);
}

// matrix_a / matrix_b: the layout is the fragment's.
template <class Use, int M, int N, int K, class T, class Layout>
void load_matrix_sync(fragment<Use, M, N, K, T, Layout>& f, const T* ptr, unsigned ldm) {
  static_assert(!std::is_same_v<Use, accumulator>, "an accumulator load takes a layout_t");
  static_assert(std::is_same_v<Layout, row_major> || std::is_same_v<Layout, col_major>);
  detail::warp_barrier("load_matrix_sync");
  detail::check_pointer("load_matrix_sync", ptr, ldm, sizeof(T));
  using F = fragment<Use, M, N, K, T, Layout>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same_v<Layout, row_major> ? ptr[r * ldm + c] : ptr[c * ldm + r];
}

template <int M, int N, int K, class T>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const T* ptr, unsigned ldm, layout_t layout) {
  detail::warp_barrier("load_matrix_sync");
  detail::check_pointer("load_matrix_sync", ptr, ldm, sizeof(T));
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c) f.x[r * N + c] = layout == mem_row_major ? ptr[r * ldm + c] : ptr[c * ldm + r];
}

template <int M, int N, int K, class T>
void store_matrix_sync(T* ptr, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  detail::warp_barrier("store_matrix_sync");
  detail::check_pointer("store_matrix_sync", ptr, ldm, sizeof(T));
  for (int e = int(lattn_emu::lane_id()); e < M * N; e += 32) {
    const int r = e / N, c = e % N;
    (layout == mem_row_major ? ptr[r * ldm + c] : ptr[c * ldm + r]) = f.x[e];
  }
}

template <int M, int N, int K, class TA, class TB, class LA, class LB, class TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  detail::warp_call("mma_sync");
  // Only the lane's share of the result: the elements store_matrix_sync has this lane write. The
  // others keep c's values (a kernel cannot tell: CUDA leaves the mapping unspecified, and code
  // correct on a GPU touches accumulator elements only uniformly or through store_matrix_sync),
  // and the products cost what they cost a warp, not 32 times that.
  TC out[M * N];
  for (int e = 0; e < M * N; ++e) out[e] = c.x[e];
  for (int e = int(lattn_emu::lane_id()); e < M * N; e += 32) {
    const int i = e / N, j = e % N;
    float acc = detail::widen(c.x[e]);
    for (int k = 0; k < K; ++k) acc = fmaf(detail::widen(a.x[i * K + k]), detail::widen(b.x[k * N + j]), acc);
    out[e] = detail::narrow<TC>(acc);
  }
  for (int e = 0; e < M * N; ++e) d.x[e] = out[e];
}

}  // namespace nvcuda::wmma
