// The CUDA layer (cuBLAS projections, the scan / chunked and sliding-window kernels, the norm and
// gate of kernels/layer/cuda.cu): its scratch against a closed form written out here, a second
// call over the same scratch, the suite's model width, and a whole CLI run. Runs only with a GPU
// (test_cuda_main.cpp skips otherwise).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/check.hpp"
#include "test_util.hpp"

using namespace lattn;
namespace fs = std::filesystem;

namespace {

// Two calls of the layer case (the second reuses the scratch and must overwrite every output),
// checked against the float64 reference.
test::Outcome run_cuda_layer(const LayerProblem& p, Mode mode, std::uint64_t seed = 5) {
  auto backend = make_backend("cuda", BackendOptions{});
  const Case kase = test::layer_case(p, mode, "cuda");
  if (auto why = backend->unsupported(kase)) FAIL("unsupported: " << *why);
  const TensorSet all = make_case_inputs(kase, seed);
  const Reference reference = kase.op->reference(kase, all, kase.backward());
  auto prepared = backend->find(kase.op->name, kase.impl)->prepare(kase, all.inputs_for(mode));
  prepared->run();
  prepared->run();
  TensorSet outputs = make_case_outputs(kase);
  prepared->read_outputs(outputs);
  return {check_outputs(kase, outputs, reference), prepared->memory(), prepared->bwd_states()};
}

// The scratch one call takes, each block rounded up to 256 bytes: q k v Lin Swa Y and a projection
// tile, h0 and hT, the window's lse (and 1/RMS for fwd_bwd); the backward's dY dLin dSwa, two sets
// of dq dk dv, dg's row terms, the gate sums, dh0 and the window backward's one float per row.
std::size_t expected_scratch(const LayerProblem& p, bool backward) {
  auto r256 = [](std::size_t bytes) { return (bytes + 255) / 256 * 256; };
  const std::size_t N = r256(p.token_elems() * 4), S = r256(p.linear.state_elems() * 4),
                    R = r256(p.linear.heads_total() * p.linear.seq * 4);
  const std::size_t forward = 7 * N + 2 * S + R;
  return backward ? forward + R + 10 * N + R + S + R : forward;
}

}  // namespace

TEST_CASE("the CUDA layer's scratch equals its closed form and a second call gives the same answer", "[cuda][layer]") {
  std::vector<LayerProblem> shapes = test::layer_test_shapes();
  shapes.push_back({{2, 8, 513, 64, 128, Decay::none}, 128, false});  // the suite's model width 512, ragged last chunk
  for (LayerProblem p : shapes)
    for (bool chunked : {false, true})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        p.chunked = chunked;
        INFO(test::describe(p.linear) << " W" << p.window << (chunked ? " chunked " : " scan ") << to_string(mode));
        const test::Outcome r = run_cuda_layer(p, mode);
        std::string errors;
        for (const auto& [name, err] : r.check.per_output) errors += fmt::format("{}={:.2e} ", name, err);
        INFO(errors);
        CHECK(r.check.non_finite.empty());
        CHECK(r.check.passed);
        CHECK(r.check.per_output.size() == (mode == Mode::fwd ? 1u : 8u));
        CHECK(r.memory.temp_bytes == expected_scratch(p, mode == Mode::fwd_bwd));
      }
}

TEST_CASE("the CUDA backend runs the layer suite (no skipped cases) and reports its scratch", "[cuda][layer][cli]") {
  const fs::path out = fs::temp_directory_path() / ("lattn-cuda-layer-" + std::to_string(::getpid()) + ".json");
  const auto run = test::run_process(test::binary() + " --backend cuda --suite layer --seq 64 --heads 2 --head-dim 16 "
                                     "--window 8 --reps 2 --warmup 1 --quiet --out " + out.string());
  INFO(run.output);
  REQUIRE(run.exit_status == 0);
  const nlohmann::json doc = nlohmann::json::parse(std::ifstream(out));
  fs::remove(out);
  REQUIRE(doc["results"].size() == 4);  // scan and chunked, fwd and fwd_bwd
  for (const auto& r : doc["results"]) {
    INFO(r.dump());
    CHECK(r["status"] == "ok");
    CHECK(r["temp_mb"].get<double>() > 0);
  }
}
