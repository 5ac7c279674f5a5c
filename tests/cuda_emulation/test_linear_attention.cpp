// The scan and chunked kernels (kernels/cuda/scan.cu, chunked.cu), run in the emulation, against
// the float64 reference (kernels/reference/linear_attention_ref.cpp) with the runner's inputs and
// tolerances (src/inputs.cpp, src/check.cpp): every output of fwd_bwd (o, hT, dq, dk, dv, dh0) on
// D = 1, D off multiples of 16 and 32, ragged last chunks, chunk > seq, both decays, float32 and
// bf16 (inputs rounded to bf16 before the reference sees them, as the runner does). And every
// staging height (RB) the chunked launcher can choose under the device limit of this run, with
// both of its budgets (two blocks per multiprocessor, then one), read from the launch log.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include "src/check.hpp"
#include "kernels/linear_attention/cuda.hpp"
#include "kernels/linear_attention/op.hpp"
#include "device_buffers.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "lattn_emu/control.hpp"

using namespace lattn;
using namespace lattn::emulation_test;

namespace {

enum class Kernel { scan, chunked };

std::string describe(const Problem& p, Kernel form, cuda::Dtype dtype, const std::string& gate_norm = "16") {
  return std::string(form == Kernel::scan ? "scan" : "chunked") + (dtype == cuda::Dtype::f32 ? " float32" : " bf16") +
         " B" + std::to_string(p.batch) + " H" + std::to_string(p.heads) + " T" + std::to_string(p.seq) + " D" +
         std::to_string(p.dim) + " C" + std::to_string(p.chunk) + " " + to_string(p.decay) +
         (gated(p.decay) ? " gate_norm " + gate_norm : "");
}

// One fwd_bwd in the emulation, every output held to the reference; returns the check.
// The case of the linear-attention op these kernels compute (its inputs, reference and tolerance).
Case case_of(const Problem& p, Kernel form, cuda::Dtype dtype, Mode mode, const std::string& gate_norm = "16") {
  Case c;
  c.op = &linear_attention_op();
  c.impl = form == Kernel::scan ? "scan" : "chunked";
  c.mode = mode;
  c.backend = "cuda";
  c.dtype = dtype == cuda::Dtype::f32 ? "float32" : "bf16";
  c.batch = p.batch;
  c.heads = p.heads;
  c.seq = p.seq;
  c.dim = p.dim;
  c.chunk = p.chunk;
  c.decay = to_string(p.decay);
  if (gated(p.decay)) c.options["gate_norm"] = gate_norm;
  return c;
}

CheckResult run_case(const Problem& p, Kernel form, cuda::Dtype dtype, std::uint64_t seed = 7,
                     const std::string& gate_norm = "16") {
  const Case kase = case_of(p, form, dtype, Mode::fwd_bwd, gate_norm);
  const TensorSet in = make_case_inputs(kase, seed);  // bf16 cases: the token tensors rounded
  const DeviceBuffer q = upload_tokens(in.at("q").data, dtype), k = upload_tokens(in.at("k").data, dtype),
                     v = upload_tokens(in.at("v").data, dtype), dO = upload_tokens(in.at("dO").data, dtype),
                     h0 = upload(in.at("h0").data), dhT = upload(in.at("dhT").data);
  const DeviceBuffer o = output(p.token_elems()), hT = output(p.state_elems()), dq = output(p.token_elems()),
                     dk = output(p.token_elems()), dv = output(p.token_elems()), dh0 = output(p.state_elems());
  // The gates (float32 whatever the dtype) and their gradient, for gated decays.
  const bool gates = gated(p.decay);
  const DeviceBuffer g = upload(gates ? in.at("g").data : std::vector<float>{0.0f});
  const DeviceBuffer dg = output(gates ? p.gate_elems() : 1);
  CountingDeviceAllocator allocator;
  const cuda::DeviceForward fwd{q.get(), k.get(), v.get(), h0.f(), o.f(), hT.f(), gates ? g.f() : nullptr};
  const cuda::DeviceBackward bwd{q.get(), k.get(), v.get(), h0.f(), dO.get(), dhT.f(), dq.f(), dk.f(), dv.f(), dh0.f(),
                                 gates ? g.f() : nullptr, gates ? dg.f() : nullptr};
  if (form == Kernel::scan) {
    cuda::scan_forward(p, dtype, fwd, allocator, nullptr);
    cuda::scan_backward(p, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() == std::max(cuda::scan_forward_workspace_bytes(p), cuda::scan_backward_workspace_bytes(p)));
  } else {
    cuda::chunked_forward(p, dtype, fwd, allocator, nullptr);
    cuda::chunked_backward(p, dtype, bwd, allocator, nullptr);
    CHECK(allocator.peak() ==
          std::max(cuda::chunked_forward_workspace_bytes(p), cuda::chunked_backward_workspace_bytes(p)));
  }
  TensorSet out = make_case_outputs(kase);
  for (const auto& [name, buffer] : {std::pair{"o", &o}, {"hT", &hT}, {"dq", &dq}, {"dk", &dk}, {"dv", &dv}, {"dh0", &dh0}})
    out.at(name).data = buffer->floats();
  if (gates) out.at("dg").data = dg.floats();
  return check_outputs(kase, out, kase.op->reference(kase, in, true));
}

std::string errors(const CheckResult& c) {
  std::string s;
  for (const auto& [name, e] : c.per_output) s += name + "=" + std::to_string(e) + " ";
  return s + (c.non_finite.empty() ? "" : "non-finite at " + c.non_finite);
}

void expect_pass(const Problem& p, Kernel form, cuda::Dtype dtype) {
  INFO(describe(p, form, dtype));
  const CheckResult r = run_case(p, form, dtype);
  INFO(errors(r));
  CHECK(r.non_finite.empty());
  CHECK(r.passed);
}

// The staging height of a chunked launch: the RB whose layout has the launch's shared bytes.
int staged_rows(const Problem& p, cuda::Dtype dtype, std::size_t shared) {
  int found = 0;
  for (int rb = 16; rb <= 64; rb += 16)
    if (cuda::chunked_shared_bytes(p, dtype, rb) == shared) found = rb;
  return found;
}

}  // namespace

TEST_CASE("emulation: scan and chunked match the float64 reference", "[emulation][linear]") {
  // (batch, heads, seq, dim, chunk, decay): D = 1; D = 20 and 33 (neither a multiple of 16 nor of
  // 32: padded tiles, idle lanes); D = 72 (a second, narrower column slice: chunked 64 + 16, scan
  // 32 + 32 + 8); ragged last chunks (37 = 2 x 16 + 5, 45 = 32 + 13); chunk > seq; chunk 1; two
  // heads under retnet (two gammas).
  const std::vector<Problem> shapes = {
      {1, 1, 9, 1, 4, Decay::retnet},   {1, 2, 37, 20, 16, Decay::retnet}, {2, 1, 45, 33, 32, Decay::none},
      {1, 1, 20, 8, 64, Decay::none},   {1, 1, 50, 72, 48, Decay::retnet}, {1, 2, 7, 16, 1, Decay::retnet},
      {1, 1, 70, 32, 64, Decay::none}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const Problem& p : shapes)
      for (Kernel form : {Kernel::scan, Kernel::chunked}) expect_pass(p, form, dtype);
}

TEST_CASE("emulation: the gated scan matches the float64 reference", "[emulation][linear][gated]") {
  // Scalar and vector gates at gate_norm 16 and 1 (strong): D = 1; D = 20 and 33 (idle lanes, a
  // ragged last row group); D = 72 (a third, narrower column slice); T past several token stages
  // and not a multiple of them; two heads, one batch of two. dg included.
  const std::vector<Problem> shapes = {{1, 1, 9, 1, 4, Decay::scalar},   {1, 2, 37, 20, 16, Decay::vector},
                                       {2, 1, 45, 33, 32, Decay::scalar}, {1, 1, 50, 72, 48, Decay::vector},
                                       {1, 2, 7, 16, 1, Decay::vector},   {1, 1, 70, 32, 64, Decay::scalar}};
  for (cuda::Dtype dtype : {cuda::Dtype::f32, cuda::Dtype::bf16})
    for (const Problem& p : shapes)
      for (const std::string gate_norm : {"16", "1"}) {
        INFO(describe(p, Kernel::scan, dtype, gate_norm));
        const CheckResult r = run_case(p, Kernel::scan, dtype, 7, gate_norm);
        INFO(errors(r));
        CHECK(r.per_output.count("dg") == 1);
        CHECK(r.non_finite.empty());
        CHECK(r.passed);
      }
}

TEST_CASE("emulation: the chunked launcher's every staging height, under this run's device limit",
          "[emulation][tiles]") {
  const std::size_t limit = lattn_emu::shared_optin_limit();
  // Small chunks give RB = the padded chunk (16, 32, 48) or 64 with two blocks per multiprocessor;
  // the long chunks at dim 16 make the two-block budget choose a smaller RB than the chunk allows,
  // and dim 128 leaves only the one-block budget (at chunk 48 and 80: RB 48 on A100's limit, 64 on
  // H100's). Which of them picks what depends on the limit; the set of heights must be complete.
  struct Shape {
    Problem p;
    cuda::Dtype dtype;
  };
  const std::vector<Shape> shapes = {
      {{1, 1, 20, 24, 16, Decay::retnet}, cuda::Dtype::bf16}, {{1, 1, 40, 24, 32, Decay::none}, cuda::Dtype::f32},
      {{1, 1, 48, 24, 48, Decay::retnet}, cuda::Dtype::f32},  {{1, 1, 70, 24, 64, Decay::none}, cuda::Dtype::bf16},
      {{1, 1, 112, 16, 112, Decay::none}, cuda::Dtype::f32},  {{1, 1, 128, 16, 128, Decay::retnet}, cuda::Dtype::f32},
      {{1, 1, 144, 16, 144, Decay::none}, cuda::Dtype::f32},  {{1, 1, 160, 16, 160, Decay::retnet}, cuda::Dtype::f32},
      {{1, 1, 176, 16, 176, Decay::none}, cuda::Dtype::f32},  {{1, 1, 208, 16, 208, Decay::retnet}, cuda::Dtype::f32},
      {{1, 1, 48, 128, 48, Decay::retnet}, cuda::Dtype::f32}, {{1, 1, 80, 128, 80, Decay::none}, cuda::Dtype::f32}};
  std::set<int> heights, below_chunk, one_block;
  const std::size_t two_blocks = limit / 2 - 1024;
  for (const Shape& s : shapes) {
    if (cuda::chunked_unsupported(s.p, s.dtype, limit)) continue;
    lattn_emu::clear_launch_log();
    expect_pass(s.p, Kernel::chunked, s.dtype);
    const auto log = lattn_emu::launch_log();
    REQUIRE(log.size() == 4);  // forward; dq, dv, dk
    for (const auto& launch : log) {
      const int rb = staged_rows(s.p, s.dtype, launch.shared);
      INFO(describe(s.p, Kernel::chunked, s.dtype) << ": " << launch.kernel << " with " << launch.shared << " bytes");
      REQUIRE(rb != 0);
      CHECK(rb == staged_rows(s.p, s.dtype, log.front().shared));  // one height per case
      heights.insert(rb);
      if (rb < std::min(64, (std::min(s.p.chunk, s.p.seq) + 15) / 16 * 16)) below_chunk.insert(rb);
      if (launch.shared > two_blocks) one_block.insert(rb);
    }
  }
  INFO("device limit " << limit);
  CHECK(heights == std::set<int>{16, 32, 48, 64});
  CHECK(below_chunk == std::set<int>{16, 32, 48});  // the limit, not the chunk, chose these
  CHECK(!one_block.empty());                          // and the one-block budget was used
}
