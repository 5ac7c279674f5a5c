// The CPU backend's rows for plugin impls (docs/plugins.md): a HostCase like every CPU row's, whose
// one call is the plugin's forward (and backward), with the case's buffers bound by name once,
// scratch from the case's counting allocator (256-byte aligned, as the interface promises) and the
// run's threads in lattn_case.threads, and the tensors in the layout the impl takes
// (src/run/plugin_layout.hpp). What the call shares with the CUDA rows is src/plugin_call.
#include "backends/cpu/plugin_rows.hpp"

#include "backends/cpu/host_case.hpp"
#include "src/plugins/plugin_call.hpp"
#include "src/run/plugin_layout.hpp"

namespace lattn::cpu {

std::vector<ImplRow> plugin_rows(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins, int threads) {
  std::vector<ImplRow> rows;
  for (const PluginImplRef& ref : plugin_impls_for(plugins, "cpu")) {
    ImplRow row{"linear_attention", ref.name, nullptr, nullptr, nullptr};
    row.unsupported = [ref, threads](const Case& c) -> std::optional<std::string> {
      if (c.dtype != "float32") return "plugin impls run float32 only on the CPU backend, not " + c.dtype;
      return plugin_unsupported(ref, c, "cpu", threads);
    };
    row.prepare = [ref, threads](const Case& c, const TensorSet& inputs) {
      return prepare_in_layout(ref.functions->layout(), c, inputs, [&](const TensorSet& in_layout) {
        auto h = std::make_unique<HostCase>(c, in_layout, host_memory_256());
        auto plugin_case = std::make_shared<const PluginCase>(c, "cpu", threads);
        auto gamma = std::make_shared<const std::vector<float>>(plugin_gamma(c));
        HostCase* self = h.get();
        const lattn_tensors2 tensors = plugin_tensors(
            c, [self](const std::string& name) -> void* { return self->data(name); },
            gamma->empty() ? nullptr : gamma->data());
        h->bind([ref, plugin_case, gamma, tensors](Allocator& a) { call_plugin(ref, plugin_case->get(), tensors, a, nullptr); });
        if (auto why = ref.functions->uncounted_scratch())
          h->set_temp_uncounted(*why, [ref, plugin_case](const std::function<void()>& call) {
            return ref.functions->watch_scratch(plugin_case->get(), call);
          });
        return std::unique_ptr<PreparedCase>(std::move(h));
      });
    };
    // The plugin's scratch is not known before it runs; the memory guard counts the tensors.
    row.memory_estimate = host_tensor_bytes;
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace lattn::cpu
