// How a backend's plugin row calls a plugin's impl (backends/cpu/plugin_rows.cpp and
// backends/cuda/plugin_rows.cpp share all of it but where the buffers live): the lattn_case of a
// planned case (version 2's lattn_case2; a version 1 impl reads its first fields), the lattn_tensors2 bound by name to the prepared case's buffers, scratch through
// the backend's counting allocator (so a plugin's scratch is temp_mb like any kernel's), and one
// call: the forward with no cotangent or gradient in sight, then the backward with what it saved.
#pragma once

#include <lattn/plugin_v2.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/case.hpp"
#include "core/workspace.hpp"
#include "src/plugins/plugins.hpp"

namespace lattn {

// One plugin impl as a backend row holds it; the plugin stays loaded while the row lives.
struct PluginImplRef {
  std::shared_ptr<const LoadedPlugin> plugin;
  std::shared_ptr<const ImplFunctions> functions;
  std::string name;  // NAME:IMPL
};

// The impls of the loaded plugins whose device is `device` ("cpu", "cuda").
std::vector<PluginImplRef> plugin_impls_for(const std::vector<std::shared_ptr<const LoadedPlugin>>& plugins,
                                            const std::string& device);

// A planned case as the plugin sees it. It points into itself, so it is neither copied nor moved.
class PluginCase {
 public:
  PluginCase(const Case& kase, const std::string& device, int threads);
  PluginCase(const PluginCase&) = delete;
  PluginCase& operator=(const PluginCase&) = delete;
  const lattn_case2& get() const { return c_; }

 private:
  std::string op_, mode_, decay_, rule_, dtype_, device_;
  lattn_case2 c_{};
};

// Why the impl does not run the case: a fwd_bwd case and no backward, a shape the interface has no
// fields for (grouped heads, Dk != Dv, packed documents), a rule or form only version 2 describes
// for a version 1 impl, or the plugin's own reason. The backend's limits (dtypes, its device) are
// the row's to check first.
std::optional<std::string> plugin_unsupported(const PluginImplRef& ref, const Case& kase, const std::string& device,
                                              int threads);

// The case's tensors by name from the prepared case's buffers (`data`, host or device pointers),
// NULL for those the case does not have; gamma is the row's own buffer of retnet's gamma_h.
lattn_tensors2 plugin_tensors(const Case& kase, const std::function<void*(const std::string&)>& data, const float* gamma);

// gamma_h per head for the case's decay, float32 (docs/spec.md section 1); empty when it has no gamma.
std::vector<float> plugin_gamma(const Case& kase);

// One call of the case: forward with dO, dhT and every gradient NULL, then (fwd_bwd) backward with
// the forward's saved pointer, on `stream` (CUDA; NULL on the CPU). Throws RuntimeFailure with the
// plugin's message when either returns nonzero, or when the call leaves scratch allocated.
// (A Python impl's message is its exception's last line.)
void call_plugin(const PluginImplRef& ref, const lattn_case2& c, const lattn_tensors2& tensors, Allocator& scratch,
                 void* stream);

}  // namespace lattn
