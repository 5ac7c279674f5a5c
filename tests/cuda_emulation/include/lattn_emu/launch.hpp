// The emulated `kernel<<<grid, block, shared, stream>>>(args)`. The build step
// (tests/cuda_emulation/emulate_cu.cmake) rewrites each launch of a .cu into
// `lattn_emu::launch(kernel, grid, block, shared, stream)(args)`, and gives each kernel a first
// parameter, Kernel<"name", Bounds{__launch_bounds__ arguments}>, so that the launcher knows the
// kernel's name (for its messages and the launch log) and its launch bounds (which it checks).
// The launch runs the whole grid before it returns: streams are synchronous here.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <tuple>
#include <utility>

namespace lattn_emu {

template <std::size_t N>
struct Name {
  char text[N];
  constexpr Name(const char (&s)[N]) { std::copy_n(s, N, text); }
};

// __launch_bounds__(max_threads, min_blocks); 0: not given.
struct Bounds {
  int max_threads = 0;
  int min_blocks = 0;
};

template <Name N, Bounds B>
struct Kernel {
  static constexpr const char* name() { return N.text; }
  static constexpr Bounds bounds() { return B; }
};

struct LaunchConfig {
  const void* kernel;
  const char* name;
  Bounds bounds;
  dim3 grid, block;
  std::size_t shared;
  cudaStream_t stream;
};

// Checks the configuration against the device's limits and the kernel's attributes, records it
// in the launch log, then runs every block, calling `thread_body` once per CUDA thread (on a host
// thread or a fiber of its own, with the built-in index variables set). Throws Error for a broken rule, and
// for anything a thread of the kernel threw.
void run_grid(const LaunchConfig& config, const std::function<void()>& thread_body);

template <class Tag, class... P>
class TaggedLaunch {
 public:
  TaggedLaunch(void (*kernel)(Tag, P...), LaunchConfig config) : kernel_(kernel), config_(config) {}
  template <class... A>
  void operator()(A&&... args) const {
    // Kernel parameters are copied once at the launch, as the arguments of a CUDA launch are.
    const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    run_grid(config_, [&] { std::apply([&](const auto&... p) { kernel_(Tag{}, p...); }, params); });
  }

 private:
  void (*kernel_)(Tag, P...);
  LaunchConfig config_;
};

template <class... P>
class PlainLaunch {
 public:
  PlainLaunch(void (*kernel)(P...), LaunchConfig config) : kernel_(kernel), config_(config) {}
  template <class... A>
  void operator()(A&&... args) const {
    const std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    run_grid(config_, [&] { std::apply([&](const auto&... p) { kernel_(p...); }, params); });
  }

 private:
  void (*kernel_)(P...);
  LaunchConfig config_;
};

template <Name N, Bounds B, class... P>
TaggedLaunch<Kernel<N, B>, P...> launch(void (*kernel)(Kernel<N, B>, P...), dim3 grid, dim3 block,
                                        std::size_t shared = 0, cudaStream_t stream = nullptr) {
  return {kernel, {reinterpret_cast<const void*>(kernel), N.text, B, grid, block, shared, stream}};
}

// A kernel the build step did not tag (one defined in a header): no name, no bounds.
template <class... P>
PlainLaunch<P...> launch(void (*kernel)(P...), dim3 grid, dim3 block, std::size_t shared = 0,
                         cudaStream_t stream = nullptr) {
  return {kernel, {reinterpret_cast<const void*>(kernel), "(untagged kernel)", Bounds{}, grid, block, shared, stream}};
}

}  // namespace lattn_emu
