// The example CUDA plugin (examples/plugins/mine_cuda.cu) in the emulation, called as lattnbench
// calls it (src/plugin_call.cpp): its entry point and impl table, what it declines, and its forward
// on device buffers against the float64 reference, both decays, D from 1 to past a warp.
#include <catch2/catch.hpp>
#include <lattn/plugin.h>

#include <cstring>
#include <string>

#include "cases.hpp"
#include "core/op.hpp"
#include "device_buffers.hpp"
#include "kernels/linear_attention/op.hpp"
#include "src/check.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

lattn_case plugin_case(const Case& k, const char* dtype = "float32") {
  lattn_case c{};
  c.op = "linear_attention";
  c.mode = "fwd";
  c.decay = k.decay.c_str();
  c.rule = "additive";
  c.dtype = dtype;
  c.device = "cuda";
  c.batch = k.batch;
  c.heads = k.heads;
  c.seq = k.seq;
  c.dim = k.dim;
  c.chunk = k.chunk;
  c.scale = attention_scale(k.dim);
  return c;
}

}  // namespace

TEST_CASE("emulation: the example CUDA plugin's table and what it declines", "[plugin]") {
  const lattn_plugin* plugin = lattn_plugin_v1();
  REQUIRE(plugin != nullptr);
  CHECK(plugin->abi == LATTN_PLUGIN_ABI);
  CHECK(std::string(plugin->name) == "mine_cuda");
  REQUIRE(plugin->impl_count == 1);
  const lattn_impl& impl = plugin->impls[0];
  CHECK(std::string(impl.name) == "scan");
  CHECK(std::string(impl.device) == "cuda");
  CHECK(impl.backward == nullptr);  // forward only: lattnbench skips its fwd_bwd cases
  const Case k = test::kernel_case({1, 1, 8, 8, 4, Decay::none}, "mine_cuda:scan", Mode::fwd, "cuda");
  lattn_case c = plugin_case(k);
  CHECK(impl.unsupported(&c) == nullptr);
  c.dtype = "bfloat16";
  CHECK(impl.unsupported(&c) != nullptr);
  c = plugin_case(k);
  c.decay = "scalar";
  CHECK(impl.unsupported(&c) != nullptr);
  c = plugin_case(k);
  c.rule = "delta";
  CHECK(impl.unsupported(&c) != nullptr);
  c = plugin_case(k);
  c.dim = 1025;
  CHECK(impl.unsupported(&c) != nullptr);
}

TEST_CASE("emulation: the example CUDA plugin's forward matches the float64 reference", "[plugin]") {
  const lattn_impl& impl = lattn_plugin_v1()->impls[0];
  const std::vector<Problem> shapes = {
      {1, 1, 9, 1, 4, Decay::none}, {1, 3, 21, 20, 16, Decay::retnet}, {2, 1, 17, 40, 16, Decay::none}};
  for (const Problem& p : shapes) {
    const Case kase = test::kernel_case(p, "mine_cuda:scan", Mode::fwd, "cuda");
    INFO(test::describe(kase));
    const TensorSet in = make_case_inputs(kase, 11);
    const DeviceBuffer q = upload(in.at("q").data), k = upload(in.at("k").data), v = upload(in.at("v").data),
                       h0 = upload(in.at("h0").data);
    std::vector<float> gammas;
    for (int h = 0; h < p.heads; ++h) gammas.push_back(float(decay_gamma(p.decay, h)));
    const DeviceBuffer gamma = upload(gammas);
    const DeviceBuffer o = output(p.token_elems()), hT = output(p.state_elems());
    lattn_tensors t{};
    t.q = q.get();
    t.k = k.get();
    t.v = v.get();
    t.h0 = h0.f();
    t.gamma = p.decay == Decay::retnet ? gamma.f() : nullptr;
    t.o = o.get();
    t.hT = hT.f();
    const lattn_case c = plugin_case(kase);
    char err[256] = "";
    void* saved = reinterpret_cast<void*>(1);
    REQUIRE(impl.forward(&c, &t, nullptr, nullptr, &saved, err, sizeof err) == 0);
    CHECK(saved == nullptr);
    TensorSet out = make_case_outputs(kase);
    out.at("o").data = o.floats();
    out.at("hT").data = hT.floats();
    const CheckResult r = check_outputs(kase, out, kase.op->reference(kase, in, false));
    INFO("o " << r.per_output.at("o") << " hT " << r.per_output.at("hT"));
    CHECK(r.passed);
  }
}
