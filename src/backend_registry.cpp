// Backends are registered here explicitly, CPU always and CUDA when it was built: no work in
// static constructors.
#include "backend.hpp"
#include "cpu/cpu_backend.hpp"
#include "error.hpp"

#ifdef LATTN_HAVE_CUDA
#include "cuda/cuda_backend.hpp"
#endif

namespace lattn {

void PreparedCase::read_layer_outputs(LayerTensors&) {
  throw RuntimeFailure("read_layer_outputs on a case that is not a layer case");
}

std::unique_ptr<PreparedCase> Backend::prepare_layer(const Case&, const LayerTensors&) {
  throw RuntimeFailure("the " + name() + " backend has no layer suite");
}

std::vector<std::string> backend_names() { return {"cpu", "cuda"}; }

std::unique_ptr<Backend> make_backend(const std::string& name, const BackendOptions& options) {
  if (name == "cpu") return cpu::make_cpu_backend(options);
  if (name == "cuda") {
#ifdef LATTN_HAVE_CUDA
    return cuda::make_cuda_backend(options);
#else
    throw UsageError("--backend cuda", "no CUDA device: this lattnbench was built without the CUDA backend "
                                       "(configure with -DLATTN_CUDA=ON and the CUDA toolkit)");
#endif
  }
  throw UsageError("--backend", "unknown backend '" + name + "' (expected one of: cpu, cuda)");
}

}  // namespace lattn
