// The example CUDA plugin (examples/plugins/mine_cuda.cu) in the emulation, called through
// lattnbench's own plugin call (src/plugins/plugin_call.cpp, as the CUDA backend's plugin rows call it):
// its entry point and impl table, what it declines, and its forward on device buffers against the
// float64 reference, both decays, D from 1 to past a warp.
#include <catch2/catch.hpp>
#include <lattn/plugin.h>

#include <map>
#include <string>

#include "cases.hpp"
#include "core/op.hpp"
#include "device_buffers.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/run/check.hpp"
#include "src/plugins/plugin_call.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

PluginImplRef example_impl() {
  const lattn_plugin* plugin = lattn_plugin_v1();
  return {nullptr, c_impl_functions(&plugin->impls[0]), std::string(plugin->name) + ":" + plugin->impls[0].name};
}

}  // namespace

TEST_CASE("emulation: the example CUDA plugin's table and what it declines", "[plugin]") {
  const lattn_plugin* plugin = lattn_plugin_v1();
  REQUIRE(plugin != nullptr);
  CHECK(plugin->abi == LATTN_PLUGIN_ABI);
  CHECK(std::string(plugin->name) == "mine_cuda");
  REQUIRE(plugin->impl_count == 1);
  CHECK(std::string(plugin->impls[0].name) == "scan");
  CHECK(std::string(plugin->impls[0].device) == "cuda");
  const PluginImplRef ref = example_impl();
  Case kase = test::kernel_case({1, 1, 8, 8, 4, Decay::none}, ref.name, Mode::fwd, "cuda");
  CHECK_FALSE(plugin_unsupported(ref, kase, "cuda", 0));
  kase.mode = Mode::fwd_bwd;  // forward only: lattnbench skips its fwd_bwd cases
  CHECK(plugin_unsupported(ref, kase, "cuda", 0) == "mine_cuda:scan has no backward (fwd only)");
  kase.mode = Mode::fwd;
  for (const auto& [field, value] : {std::pair<std::string, std::string>{"dtype", "bf16"}, {"decay", "scalar"},
                                     {"rule", "delta"}, {"dim", "1025"}}) {
    Case declined = kase;
    if (field == "dtype") declined.dtype = value;
    if (field == "decay") declined.decay = value;
    if (field == "rule") declined.options["rule"] = value;
    if (field == "dim") declined.dim = std::stoi(value);
    INFO(field << " " << value);
    CHECK(plugin_unsupported(ref, declined, "cuda", 0).has_value());
  }
}

TEST_CASE("emulation: the example CUDA plugin's forward matches the float64 reference", "[plugin]") {
  const PluginImplRef ref = example_impl();
  const std::vector<Problem> shapes = {
      {1, 1, 9, 1, 4, Decay::none}, {1, 3, 21, 20, 16, Decay::retnet}, {2, 1, 17, 40, 16, Decay::none}};
  for (const Problem& p : shapes) {
    const Case kase = test::kernel_case(p, ref.name, Mode::fwd, "cuda");
    INFO(test::describe(kase));
    const TensorSet in = make_case_inputs(kase, 11);
    std::map<std::string, DeviceBuffer> device;
    for (const char* name : {"q", "k", "v", "h0"}) device[name] = upload(in.at(name).data);
    device["o"] = output(p.token_elems());
    device["hT"] = output(p.state_elems());
    const std::vector<float> gamma = plugin_gamma(kase);
    const DeviceBuffer gamma_buffer = upload(gamma);
    const lattn_tensors2 tensors = plugin_tensors(
        kase, [&](const std::string& name) { return device.at(name).get(); }, gamma.empty() ? nullptr : gamma_buffer.f());
    const PluginCase c(kase, "cuda", 0);
    CountingDeviceAllocator allocator;
    call_plugin(ref, c.get(), tensors, allocator, nullptr);
    TensorSet out = make_case_outputs(kase);
    out.at("o").data = device.at("o").floats();
    out.at("hT").data = device.at("hT").floats();
    const CheckResult r = check_outputs(kase, out, kase.op->reference(kase, in, false));
    INFO("o " << r.per_output.at("o") << " hT " << r.per_output.at("hT"));
    CHECK(r.passed);
  }
}
