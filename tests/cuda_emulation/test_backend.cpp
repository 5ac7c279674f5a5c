// The CUDA backend itself (backends/cuda: its impl rows, DeviceCase, the counting device allocator,
// the layer's composition in kernels/layer/hybrid/cuda/layer.cpp) built against the emulation, with
// cuBLAS stood in by OpenBLAS (cublas_emulated.cpp): the correctness table (tests/op_table.hpp),
// every op x impl row x shape x mode x dtype against the float64 reference, the chunk states kept
// and recomputed, exactly as tests/cuda/test_cuda_ops.cpp runs it on a GPU. CTest runs it once per
// device limit, which changes the tiles the launchers choose and what the rows decline. And what
// tests/cuda/ holds the backend to beyond the table (cuda_backend_checks.hpp): its scratch against
// closed forms, the layer over two calls of one case.
#include <catch2/catch.hpp>

#include <cmath>

#include "backends/cuda/cuda_backend.hpp"
#include "kernels/decode/cuda.hpp"
#include "kernels/linear_attention/cuda/chunked_gated.hpp"
#include "kernels/linear_attention/cuda/kernels.hpp"
#include "kernels/linear_attention/cuda/variants.hpp"
#include "kernels/linear_attention/op.hpp"
#include "kernels/sliding_window/cuda.hpp"
#include "lattn_emu/control.hpp"
#include "cuda_backend_checks.hpp"
#include "op_table.hpp"

using namespace lattn;

namespace {

std::unique_ptr<Backend> emulated_cuda(const BackendOptions& options) { return cuda::make_cuda_backend(options); }

// Whether a case launches differently under the two device limits: its chunked tiles, or a block
// height of the sliding window's kernels that fits under one limit and not the other.
bool limit_matters(const Case& c) {
  if (c.op->name == "decode") return false;  // its launch takes no opt-in shared memory
  const cuda::Dtype dtype = c.dtype == "bf16" ? cuda::Dtype::bf16 : cuda::Dtype::f32;
  const Problem p = linear_problem(c);
  if (c.impl == "chunked" && p.delta()) return false;  // its kernels' launches do not depend on the limit
  if (c.impl == "chunked") {  // the additive rule's chunked kernels (the layer's linear branch too)
    for (const char* kernel : {"output", "dkv", "dq"}) {
      const cuda::GatedTiles h100 = cuda::gated_tiles(kernel, p, dtype, lattn_emu::kH100SharedOptin),
                             a100 = cuda::gated_tiles(kernel, p, dtype, lattn_emu::kA100SharedOptin);
      if (h100.rows_per_block != a100.rows_per_block || h100.blocks_per_sm != a100.blocks_per_sm) return true;
    }
    if (c.op->name == "linear_attention") return false;
  }
  if (c.op->name == "linear_attention") return false;
  const cuda::SwaProblem w{c.batch, c.heads, c.seq, c.dim, c.window};
  for (bool backward : {false, c.backward()})
    for (int rows : {64, 32, 16}) {
      const std::size_t bytes = cuda::swa_shared_bytes(w, dtype, backward, rows);
      if ((bytes <= lattn_emu::kH100SharedOptin) != (bytes <= lattn_emu::kA100SharedOptin)) return true;
    }
  return false;
}

// One op's row of the table: every impl row of the op on every shape, mode and dtype, under H100's
// limit; under A100's, the cases whose launches the limit changes (the rest would run the very
// same launches again). The layer's bf16 cases are the only ones the rows decline, under either
// limit (the layer runs float32).
void run_table_row(const std::string& op) {
  const bool a100 = lattn_emu::shared_optin_limit() == lattn_emu::kA100SharedOptin;
  int same = 0;
  const test::TableRun run = test::run_op_table("cuda", emulated_cuda, [&](const Case& c) {
    if (!a100 || limit_matters(c)) return true;
    ++same;
    return false;
  }, op);
  for (const auto& [reason, cases] : run.not_supported) WARN("not supported: " << reason << " (" << cases << " cases)");
  if (a100)
    WARN(op << ": " << run.checked << " cases launch differently under this limit and ran; " << same
            << " launch as under H100's and did not run again");
  else
    CHECK(run.checked_by_op.count(op) == 1);
  // What the CUDA backend declines, and nothing else: the layer's bf16 cases, the modern block's
  // cases (docs/spec.md section 2b, not written for CUDA), the delta rule's chunks of more than
  // 64 rows and its bf16 cases at dim < 4, the dplr rule's chunked form and decode step, the
  // trapezoidal rule, RWKV-6's bonus in the chunked form and the decode step, and DeltaProduct in
  // the decode step.
  for (const auto& [reason, cases] : run.not_supported) {
    INFO(reason);
    const bool layer_bf16 = reason.find("layer") == 0 && reason.find("float32 only") != std::string::npos;
    const bool chunked_delta =
        reason.find("linear_attention chunked") == 0 &&
        ((reason.find("no CUDA chunked variant takes rule delta") != std::string::npos &&
          reason.find("chunked_delta (the CUDA chunked delta kernels take chunks of up to 64 rows") != std::string::npos) ||
         reason.find("the CUDA chunked delta kernels take bf16 from dim 4") != std::string::npos);
    const bool decode_backward = reason.find("decode step") == 0 && reason.find("forward only") != std::string::npos;
    const bool layer_block = reason.find("layer") == 0 && reason.find("hybrid block of docs/spec.md section 2 only") != std::string::npos;
    // dplr (docs/spec.md section 1f) has a CUDA scan (scan_dplr) and no chunked form or decode step.
    const bool dplr = (reason.find("linear_attention chunked") == 0 &&
                       reason.find("no CUDA chunked variant takes rule dplr") != std::string::npos) ||
                      (reason.find("decode step") == 0 && reason.find("no kernel for rule dplr") != std::string::npos);
    // The trapezoidal rule (section 1e) has CPU kernels only too.
    const bool trapezoidal =
        (reason.find("linear_attention") == 0 && reason.find("variant takes rule trapezoidal") != std::string::npos) ||
        (reason.find("decode step") == 0 && reason.find("no trapezoidal rule") != std::string::npos);
    // RWKV-6's bonus form and DeltaProduct (docs/spec.md sections 1g, 1h): the scan rows take the
    // bonus and both tables DeltaProduct; the chunked rows decline the bonus, the decode step both.
    const bool cpu_only_form =
        (reason.find("linear_attention chunked") == 0 &&
         reason.find("chunked_gated (no bonus (RWKV-6) form)") != std::string::npos) ||
        (reason.find("decode step") == 0 && (reason.find("has no bonus (RWKV-6) form") != std::string::npos ||
                                              reason.find("takes one Householder write per token only") != std::string::npos));
    CHECK((layer_bf16 || layer_block || chunked_delta || decode_backward || dplr || trapezoidal || cpu_only_form));
  }
}

}  // namespace

TEST_CASE("emulation: the CUDA linear-attention rows match the float64 reference on the test table",
          "[emulation][backend_linear]") {
  run_table_row("linear_attention");
}

TEST_CASE("emulation: the CUDA layer rows match the float64 reference on the test table", "[emulation][backend_layer]") {
  run_table_row("layer");
}

TEST_CASE("emulation: the CUDA sliding-window row matches the float64 reference on the test table",
          "[emulation][backend_window]") {
  run_table_row("sliding_window");
}

TEST_CASE("emulation: the CUDA decode row matches the float64 reference on the test table",
          "[emulation][backend_decode]") {
  run_table_row("decode");
}

TEST_CASE("emulation: the CUDA decode row takes the deployed models' grouped heads and Dk x Dv states",
          "[emulation][backend_decode]") {
  auto backend = emulated_cuda(BackendOptions{});
  // Qwen3-Next's Gated DeltaNet (32 value heads on 16 q/k heads, 128 x 128 states, verifying a
  // draft of two), Mamba2's (one q/k group, 128 x 64 states), and a value dim over the kernel's
  // dim limit (which bounds the key rows only: blocks take the value columns in slices).
  for (const DecodeProblem& p :
       {DecodeProblem{1, 32, 2, 128, 2, Decay::scalar, Rule::delta, 16, 128},
        DecodeProblem{2, 8, 1, 128, 1, Decay::scalar, Rule::additive, 1, 64},
        DecodeProblem{1, 2, 2, 16, 2, Decay::vector, Rule::delta, 1, cuda::kDecodeMaxDim + 64}})
    for (const std::string dtype : {"float32", "bf16"}) {
      const Case c = test::decode_case(p, "cuda", dtype);
      INFO(test::describe(c) << " heads_k " << p.heads_k << " dim_v " << p.dim_v);
      REQUIRE_FALSE(backend->unsupported(c));
      const test::Outcome r = test::run_on(*backend, c, 5);
      INFO(test::errors(r.check));
      CHECK(r.check.passed);
      if (dtype == "float32") CHECK(r.check.rel_err < 1e-5);
    }
  // Past the key dim limit the row declines with the kernel's reason.
  const Case wide =
      test::decode_case({1, 1, 1, cuda::kDecodeMaxDim + 1, 1, Decay::none, Rule::additive, 0, 16}, "cuda");
  REQUIRE(backend->unsupported(wide));
  CHECK_THAT(*backend->unsupported(wide), Catch::Matchers::Contains("dim (the key dim) over"));
}

TEST_CASE("emulation: the CUDA decode row steps pooled and bf16 states", "[emulation][backend_decode]") {
  auto backend = emulated_cuda(BackendOptions{});
  for (Rule rule : {Rule::additive, Rule::delta})
    for (Decay decay : {Decay::none, Decay::retnet, Decay::scalar, Decay::vector})
      for (const bool bf16 : {false, true})
        for (const int slots : {0, 7}) {
          DecodeProblem p{3, 2, 2, 24, 2, decay, rule, 1, 40};
          p.state_slots = slots;
          p.state_bf16 = bf16;
          const Case c = test::decode_case(p, "cuda");
          INFO(test::describe(c) << " slots " << slots << " bf16 " << bf16);
          REQUIRE_FALSE(backend->unsupported(c));
          const test::Outcome r = test::run_on(*backend, c, 5);
          INFO(test::errors(r.check));
          CHECK(r.check.passed);
          // o and the snapshots from the float32 registers; hT rounded once, within 2^-8 of its norm.
          CHECK(r.check.per_output.at("o") < 1e-5);
          CHECK(r.check.per_output.at("snapshots") < 1e-5);
          CHECK(r.check.per_output.at("hT") < (bf16 ? std::ldexp(1.0, -8) : 1e-5));
          if (bf16) CHECK(r.check.per_output.at("hT") > 1e-4);
        }
}

TEST_CASE("emulation: the CUDA decode step's launch: vectors, heads per block, column slices, staged tokens",
          "[emulation][backend_decode]") {
  // At a device's 132 multiprocessors (H100, H200), as decode_step launches it there.
  constexpr int sms = 132;
  auto launch = [](DecodeProblem p, bool bf16_state) {
    p.state_bf16 = bf16_state;
    return cuda::decode_launch(p, sms);
  };
  for (const bool bf16 : {false, true}) {
    INFO("bf16 state " << bf16);
    // B 256, H 16, D 128: a head a block, 8 row groups of 16 rows x 32 vectors of 4 columns.
    const cuda::DecodeLaunch big = launch({256, 16, 1, 128}, bf16);
    CHECK(big.vector == 4);
    CHECK(big.vectorised);
    CHECK(big.rows_per_thread == 16);
    CHECK(big.row_groups == 8);
    CHECK(big.column_vectors == 32);
    CHECK(big.heads_per_block == 1);
    CHECK(big.threads == 256);
    CHECK(big.column_slices == 1);
    CHECK(big.blocks == 4096u);
    CHECK(big.stage_tokens == 1);
    // Small heads share a block while the grid keeps a block per multiprocessor.
    const cuda::DecodeLaunch d64 = launch({64, 16, 1, 64}, bf16);
    CHECK(d64.heads_per_block == 4);
    CHECK(d64.threads == 256);
    CHECK(d64.blocks == 256u);
    CHECK(launch({256, 16, 1, 32}, bf16).heads_per_block == 16);
    CHECK(launch({64, 16, 1, 32}, bf16).heads_per_block == 4);
    // Few heads: the columns are split over more blocks (8 vectors a slice at the least).
    const cuda::DecodeLaunch few = launch({1, 2, 1, 128}, bf16);
    CHECK(few.column_vectors == 8);
    CHECK(few.column_slices == 4);
    CHECK(few.heads_per_block == 1);
    // Dv not a multiple of the vector: element by element.
    CHECK_FALSE(launch({2, 3, 1, 24, 1, Decay::none, Rule::additive, 1, 37}, bf16).vectorised);
    // A draft longer than a stage; a wide key dim whose staged tokens fill the shared memory sooner.
    CHECK(launch({2, 3, 10, 16, 3, Decay::scalar, Rule::delta}, bf16).stage_tokens == 8);
    const cuda::DecodeLaunch wide = launch({1, 2, 8, cuda::kDecodeMaxDim, 2, Decay::vector, Rule::delta, 1, 8}, bf16);
    CHECK(wide.stage_tokens == 7);
    CHECK(wide.row_groups == 32);
    CHECK(wide.shared_bytes <= 48u * 1024);
  }
}

TEST_CASE("emulation: the CUDA decode step's heads per block, ragged columns, bf16 states and staged drafts",
          "[emulation][backend_decode]") {
  // Each case through the backend against the float64 reference, with the launch path it exercises
  // asserted first (cuda::decode_launch at the emulated device's 132 multiprocessors).
  auto backend = emulated_cuda(BackendOptions{});
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  struct Shape {
    DecodeProblem p;
    std::string what;
  };
  std::vector<Shape> shapes;
  for (Rule rule : {Rule::additive, Rule::delta}) {
    for (Decay decay : {Decay::retnet, Decay::vector}) {
      // 531 heads of D 32 on one q/k head: 4 heads a block (each its own retnet gamma), the last block ragged.
      shapes.push_back({{9, 59, 2, 32, 2, decay, rule, 1, 32}, "heads per block, D 32"});
      // D 64: 2 heads a block, each over two warps (a shuffle, then the shared-memory pass).
      shapes.push_back({{11, 25, 1, 64, 1, decay, rule}, "heads per block, D 64"});
    }
    for (Decay decay : {Decay::none, Decay::scalar, Decay::vector}) {
      // Dv = 37: element by element, a 4-token draft with snapshots, pooled.
      DecodeProblem ragged{3, 2, 4, 24, 4, decay, rule, 1, 37, 7};
      shapes.push_back({ragged, "ragged Dv, pooled, 4-token draft"});
      ragged.state_bf16 = true;
      shapes.push_back({ragged, "ragged Dv, bf16 state"});
      // A bf16 state in vectors, grouped heads, a 4-token draft with 3 snapshots, 9 slots for 3 sequences.
      DecodeProblem vectors{3, 4, 4, 64, 4, decay, rule, 2, 64, 9};
      vectors.state_bf16 = true;
      shapes.push_back({vectors, "bf16 state vectors, pooled, 4-token draft"});
      // Drafts over more than one stage of staged tokens: 10 tokens (8 + 2), and the widest key
      // dim with vector gates (7 + 1).
      shapes.push_back({{2, 3, 10, 16, 3, decay, rule}, "two stages"});
    }
    shapes.push_back({{1, 2, 8, cuda::kDecodeMaxDim, 2, Decay::vector, rule, 1, 8}, "two stages, dim 512"});
  }
  for (const Shape& s : shapes) {
    const DecodeProblem& p = s.p;
    const cuda::DecodeLaunch l = cuda::decode_launch(p, sms);
    INFO(s.what << ": B " << p.batch << " H " << p.heads << " T " << p.tokens << " D " << p.dim << " Dv "
                << p.value_dim() << " Hk " << p.qk_heads() << " " << to_string(p.rule) << " " << to_string(p.decay)
                << " slots " << p.state_slots << " bf16 state " << p.state_bf16);
    if (s.what.find("heads per block") == 0) {
      CHECK(l.heads_per_block > 1);
      CHECK(p.heads_total() % std::size_t(l.heads_per_block) != 0);
    }
    if (s.what.find("ragged") == 0) CHECK_FALSE(l.vectorised);
    if (s.what.find("bf16 state vectors") == 0) CHECK(l.vectorised);
    if (s.what.find("two stages") == 0) CHECK(l.stage_tokens < p.tokens);
    for (const std::string dtype : {"float32", "bf16"}) {
      if (dtype == "bf16" && s.what.find("heads per block, D 64") == 0) continue;  // the largest case: float32 only
      const Case c = test::decode_case(p, "cuda", dtype);
      INFO(test::describe(c));
      REQUIRE_FALSE(backend->unsupported(c));
      const test::Outcome r = test::run_on(*backend, c, 5);
      INFO(test::errors(r.check));
      CHECK(r.check.passed);
      if (dtype != "float32") continue;
      CHECK(r.check.per_output.at("o") < 1e-5);
      if (p.extra_slots() > 0) CHECK(r.check.per_output.at("snapshots") < 1e-5);
      CHECK(r.check.per_output.at("hT") < (p.state_bf16 ? std::ldexp(1.0, -8) : 1e-5));
    }
  }
}

TEST_CASE("emulation: the test table has no op the rows above leave out", "[emulation][backend]") {
  for (const auto& row : test::op_test_table()) {
    const std::string op = row.shapes.front().op->name;
    CHECK((op == "linear_attention" || op == "layer" || op == "sliding_window" || op == "decode"));
  }
}

TEST_CASE("emulation: the CUDA backend's availability and device block", "[emulation][backend]") {
  const auto backend = emulated_cuda(BackendOptions{});
  CHECK(backend->availability().available);
  const DeviceInfo info = backend->describe();
  REQUIRE(info.cuda);
  REQUIRE(info.cuda->gpu);
  CHECK(info.cuda->gpu->name == "lattn CPU emulation");
  CHECK(info.cuda->gpu->shared_memory_per_block_optin_kb * 1024 == double(lattn_emu::shared_optin_limit()));
  CHECK(info.cuda->gpu->sm_count > 0);
  CHECK(info.cuda->driver_cuda_version);
  REQUIRE(backend->memory_available);
  CHECK(backend->memory_available() > 0);
  CHECK(emulated_cuda(BackendOptions{0, 1})->availability().reason.find("--device 1") != std::string::npos);
}

TEST_CASE("emulation: the CUDA backend's scratch equals its closed forms", "[emulation][backend]") {
  test::check_linear_memory(emulated_cuda);
  auto backend = emulated_cuda(BackendOptions{});
  for (LayerProblem p : {LayerProblem{{1, 2, 40, 8, 16, Decay::retnet}, 5, false},
                         LayerProblem{{2, 1, 37, 16, 32, Decay::none}, 64, false}})
    for (bool chunked : {false, true})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        p.chunked = chunked;
        INFO(test::describe(p.linear) << " W" << p.window << (chunked ? " chunked " : " scan ") << to_string(mode));
        const test::Outcome r = test::run_layer_twice(*backend, p, mode);
        INFO(test::errors(r.check));
        CHECK(r.check.passed);
        CHECK(r.memory.temp_bytes == test::expected_cuda_layer_scratch(p, mode == Mode::fwd_bwd));
      }
}

TEST_CASE("emulation: the CUDA rows ask the variant tables, and skip what no variant takes with the table's reason",
          "[emulation][backend]") {
  auto backend = emulated_cuda(BackendOptions{});
  for (const std::string form : {"scan", "chunked"})
    for (const std::string& rule : rule_names())
      for (const std::string& decay : decay_names()) {
        const Problem p{1, 2, 24, 16, 8, decay_from(decay), rule_from(rule)};
        const Case c = test::kernel_case(p, form, Mode::fwd_bwd, "cuda");
        INFO(test::describe(c));
        std::string why;
        const cuda::CudaVariant* v = cuda::cuda_variant(form, p, &why);
        // No CUDA row takes the trapezoidal rule, nor a chunked row the dplr rule: skipped with the
        // table's reason.
        if (p.trapezoidal() || (p.dplr() && form == "chunked")) {
          CHECK(v == nullptr);
          const std::optional<std::string> skip = backend->unsupported(c);
          REQUIRE(skip);
          CHECK(*skip == why);
          continue;
        }
        // Every other rule and decay has a row in both forms (dplr: the scan).
        REQUIRE(v != nullptr);
        CHECK_FALSE(backend->unsupported(c));
        const std::string chunked = p.delta() ? "chunked_delta" : gated(p.decay) ? "chunked_gated" : "chunked";
        const std::string scan = p.delta() ? "scan_delta" : p.dplr() ? "scan_dplr" : "scan";
        CHECK(v->name == (form == "chunked" ? chunked : scan));
        CHECK(backend->variant(c) == v->name);
      }
  // What no chunked row takes is skipped with the table's reason: the delta rule's chunks past 64 rows.
  const Problem long_chunks{1, 2, 200, 16, 128, Decay::scalar, Rule::delta};
  std::string why_chunks;
  CHECK(cuda::cuda_variant("chunked", long_chunks, &why_chunks) == nullptr);
  const Case long_case = test::kernel_case(long_chunks, "chunked", Mode::fwd_bwd, "cuda");
  const std::optional<std::string> skip = backend->unsupported(long_case);
  REQUIRE(skip);
  CHECK(*skip == why_chunks);
  CHECK_THAT(*skip, Catch::Matchers::Contains("chunked_delta (the CUDA chunked delta kernels take chunks of up to 64 rows"));
  CHECK(backend->variant(long_case).empty());
  // The scan's dim limit is its rows' shape key: a dim over it is refused with the kernel's reason.
  const Problem wide{1, 1, 8, cuda::kScanMaxDim + 1, 8, Decay::none, Rule::additive};
  std::string why;
  CHECK(cuda::cuda_variant("scan", wide, &why) == nullptr);
  CHECK_THAT(why, Catch::Matchers::Contains("handles dim and dim_v <= " + std::to_string(cuda::kScanMaxDim)));
}

namespace {

// A kernel-suite case with the shape keys of docs/spec.md section 1c, settled as a run settles it.
Case shaped(const Problem& p, const std::string& impl, Mode mode, const std::string& dtype, int heads_k, int dim_v,
            const std::string& lengths) {
  Case c = test::kernel_case(p, impl, mode, "cuda", dtype);
  c.options["heads_k"] = std::to_string(heads_k);
  c.options["dim_v"] = std::to_string(dim_v);
  if (!lengths.empty()) c.options["lengths"] = lengths;
  if (c.op->settle) c.op->settle(c);
  return c;
}

}  // namespace

TEST_CASE("emulation: the CUDA scan rows run the section 1c shapes natively",
          "[emulation][backend]") {
  // Through the backend: DeviceCase sizes every tensor from the op's tensor specs, and the rows
  // bind them (bind_linear_tensors); the scan rows take the case as it is (their variant, no
  // gather), with the scratch of their closed forms written out here: a packed case's document
  // boundaries (N + 1 ints), and with grouped heads dq and dk per value head (B H T Dk floats:
  // one set for the additive rule, two for its gated decays and for the delta and dplr rules),
  // beside the delta rule's E (B H T Dv) or the dplr rule's U and Z (two of those), and for
  // scalar gates their per-channel dg (B H T Dk).
  auto backend = emulated_cuda(BackendOptions{});
  const Problem base{2, 4, 21, 16, 16};
  struct Shape {
    int heads_k, dim_v;
    std::string lengths;
  };
  for (const Shape& s : {Shape{2, 8, ""}, Shape{1, 32, "37+1+20"}, Shape{4, 16, "9+1+4"}})
    for (const std::string& rule : rule_names())
      for (const std::string decay : {"none", "scalar", "vector"})
        for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
          if (rule == "trapezoidal") continue;  // no CUDA row takes it (checked above)
          Problem p = base;
          p.rule = rule_from(rule);
          p.decay = decay_from(decay);
          const Case c = shaped(p, "scan", mode, "float32", s.heads_k, s.dim_v, s.lengths);
          const Problem lp = linear_problem(c);
          INFO(test::describe(c) << " heads_k " << s.heads_k << " dim_v " << s.dim_v << " lengths " << s.lengths);
          REQUIRE(!lp.square_dense());
          REQUIRE_FALSE(backend->unsupported(c));
          CHECK(backend->variant(c) == (lp.delta() ? "scan_delta" : lp.dplr() ? "scan_dplr" : "scan"));
          const test::Outcome r = test::run_on(*backend, c, 5);
          INFO(test::errors(r.check));
          CHECK(r.check.passed);
          const std::size_t cu = lp.packed() ? lp.cu_seqlens.size() * 4 : 0;
          const std::size_t part = lp.group() > 1 ? lp.heads_total() * lp.seq * lp.dim * 4 : 0;
          const std::size_t values = lp.heads_total() * lp.seq * lp.value_dim() * 4,
                            keys = lp.heads_total() * lp.seq * lp.dim * 4;
          std::size_t backward = cu + (gated(lp.decay) ? 2 : 1) * part;
          if (lp.delta()) backward = cu + 2 * part + values + (lp.decay == Decay::scalar ? keys : 0);
          if (lp.dplr()) backward = cu + 2 * part + 2 * values + (lp.decay == Decay::scalar ? keys : 0);
          CHECK(r.memory.temp_bytes == (mode == Mode::fwd ? cu : std::max(cu, backward)));
        }
}

TEST_CASE("emulation: the CUDA chunked rows run the section 1c shapes natively, states kept and recomputed",
          "[emulation][backend]") {
  // Through the backend (DeviceCase, bind_linear_tensors), the additive rule's chunked rows
  // (chunked: decay none and retnet; chunked_gated: scalar and vector gates; the same kernels), with
  // the scratch written out: a packed case's tables (the documents' boundaries and first chunks,
  // 2 (N + 1) ints), the chunk states (chunks x H x Dk x Dv floats here), kept across both calls or
  // recomputed by the backward, their gradients, for gated decays dg's row sums (chunks x H x
  // ceil(Dv / 32) x Dk floats) and with grouped heads dq and dk per value head (2 B H T Dk floats).
  const Problem base{2, 4, 21, 16, 8};
  struct Shape {
    int heads_k, dim_v;
    std::string lengths;
  };
  for (const Shape& s : {Shape{2, 8, ""}, Shape{1, 32, "37+1+20"}, Shape{4, 16, "9+1+4"}})
    for (const std::string decay : {"none", "retnet", "scalar", "vector"})
      for (const bool keep : {true, false}) {
        auto backend = emulated_cuda(BackendOptions{0, 0, keep});
        Problem p = base;
        p.decay = decay_from(decay);
        const Case c = shaped(p, "chunked", Mode::fwd_bwd, "float32", s.heads_k, s.dim_v, s.lengths);
        const Problem lp = linear_problem(c);
        INFO(test::describe(c) << " heads_k " << s.heads_k << " dim_v " << s.dim_v << " lengths " << s.lengths
                               << (keep ? " kept" : " recomputed"));
        REQUIRE(!lp.square_dense());
        REQUIRE_FALSE(backend->unsupported(c));
        CHECK(backend->variant(c) == (gated(lp.decay) ? "chunked_gated" : "chunked"));
        const test::Outcome r = test::run_on(*backend, c, 5);
        INFO(test::errors(r.check));
        CHECK(r.check.passed);
        CHECK(r.bwd_states == (keep ? "kept" : "recomputed"));
        std::size_t chunks = 0;
        for (int n = 0; n < lp.sequences(); ++n) chunks += std::size_t((lp.slice(std::size_t(n) * lp.heads).seq + 7) / 8);
        const std::size_t tables = lp.packed() ? 2 * lp.cu_seqlens.size() * 4 : 0;
        const std::size_t states = chunks * lp.heads * lp.dim * lp.value_dim() * 4;
        const std::size_t rowsums = !gated(lp.decay) ? 0 : chunks * lp.heads * ((lp.value_dim() + 31) / 32) * lp.dim * 4;
        const std::size_t parts = lp.group() > 1 ? 2 * lp.heads_total() * lp.seq * lp.dim * 4 : 0;
        CHECK(r.memory.temp_bytes == tables + 2 * states + rowsums + parts);
      }
}
