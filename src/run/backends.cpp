// The backend registration: the one file of src/ that includes a backend folder. CPU always, CUDA
// when it was built; no work in static constructors.
#include "src/run/backend.hpp"
#include "backends/cpu/cpu_backend.hpp"
#include "backends/cpu/cpu_environment.hpp"
#include "core/error.hpp"
#include "core/op.hpp"

#ifdef LATTN_HAVE_CUDA
#include "backends/cuda/cuda_backend.hpp"
#endif

namespace lattn {

void prepare_process_environment(char** argv) { cpu::prepare_cpu_environment(argv); }

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
