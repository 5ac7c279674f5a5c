// The CUDA backend's rows for plugin impls (docs/plugins.md): a DeviceCase like every CUDA row's,
// whose one call launches the plugin's forward (and backward) on the case's stream, with device
// pointers bound by name once, scratch from the case's counting allocator (cudaMalloc: 256-byte
// aligned) and retnet's gamma_h in a device buffer of the row's. What the call shares with the CPU
// rows is src/plugin_call. A bf16 case's q, k, v, dO are bf16 as for every CUDA row, and so are
// o, dq, dk, dv, which the interface has the plugin write in the case's dtype (the case widens them
// when the runner reads them); an impl that declares another layout gets its tensors in it
// (src/run/plugin_layout.hpp).
#include "backends/cuda/plugin_rows.hpp"

#include <cuda_runtime_api.h>

#include "backends/cuda/device_case.hpp"
#include "core/op.hpp"
#include "kernels/cuda/check.hpp"
#include "src/plugins/plugin_call.hpp"
#include "src/run/plugin_layout.hpp"

namespace lattn::cuda {
namespace {

// The case on the device with the plugin's call bound to its buffers (`inputs` in the impl's layout).
std::unique_ptr<PreparedCase> prepare_plugin_case(const PluginImplRef& ref, const Case& c, const TensorSet& inputs,
                                                  int device) {
  auto d = std::make_unique<DeviceCase>(c, inputs, device, std::vector<std::string>{"o", "dq", "dk", "dv"});
  auto plugin_case = std::make_shared<const PluginCase>(c, "cuda", 0);
  const std::vector<float> gamma = plugin_gamma(c);
  auto gamma_buffer = std::make_shared<DeviceBuffer>(gamma.size() * sizeof(float));
  if (!gamma.empty())
    LATTN_CUDA_CHECK(cudaMemcpy(gamma_buffer->get(), gamma.data(), gamma.size() * sizeof(float), cudaMemcpyHostToDevice));
  DeviceCase* self = d.get();
  const lattn_tensors2 tensors = plugin_tensors(
      c, [self](const std::string& name) { return self->data(name); }, static_cast<const float*>(gamma_buffer->get()));
  d->bind([self, ref, plugin_case, tensors] {
    call_plugin(ref, plugin_case->get(), tensors, self->allocator(), self->stream());
  }, "", gamma_buffer);
  if (auto why = ref.functions->uncounted_scratch())
    d->set_temp_uncounted(*why, [ref, plugin_case](const std::function<void()>& call) {
      return ref.functions->watch_scratch(plugin_case->get(), call);
    });
  return d;
}

}  // namespace

std::vector<ImplRow> plugin_rows(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins, int device) {
  std::vector<ImplRow> rows;
  for (const PluginImplRef& ref : plugin_impls_for(plugins, "cuda")) {
    ImplRow row{"linear_attention", ref.name, nullptr, nullptr, nullptr};
    row.unsupported = [ref](const Case& c) -> std::optional<std::string> {
      if (c.dtype != "float32" && c.dtype != "bf16")
        return "plugin impls run float32 and bf16 on the CUDA backend, not " + c.dtype;
      return plugin_unsupported(ref, c, "cuda", 0);
    };
    row.prepare = [ref, device](const Case& c, const TensorSet& inputs) {
      return prepare_in_layout(ref.functions->layout(), c, inputs, [&](const TensorSet& in_layout) {
        return prepare_plugin_case(ref, c, in_layout, device);
      });
    };
    // The plugin's scratch is not known before it runs; the memory guard counts the tensors.
    row.memory_estimate = [device](const Case& c) {
      return (case_input_elems(c) + case_output_elems(c)) * sizeof(float) + flush_bytes(device, c);
    };
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace lattn::cuda
