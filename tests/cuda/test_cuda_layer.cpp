// The CUDA layer (cuBLAS projections, the scan / chunked and sliding-window kernels, the norm and
// gate of kernels/layer/hybrid/cuda/kernels.cu): its scratch against a closed form (cuda_backend_checks.hpp), a second
// call over the same scratch, the suite's model width, and a whole CLI run. Runs only with a GPU
// (test_cuda_main.cpp skips otherwise).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/run/check.hpp"
#include "cuda_backend_checks.hpp"

using namespace lattn;
namespace fs = std::filesystem;

TEST_CASE("the CUDA layer's scratch equals its closed form and a second call gives the same answer", "[cuda][layer]") {
  std::vector<LayerProblem> shapes = test::layer_test_shapes();
  shapes.push_back({{2, 8, 513, 64, 128, Decay::none}, 128, false});  // the suite's model width 512, ragged last chunk
  for (LayerProblem p : shapes)
    for (bool chunked : {false, true})
      for (Mode mode : {Mode::fwd, Mode::fwd_bwd}) {
        p.chunked = chunked;
        INFO(test::describe(p.linear) << " W" << p.window << (chunked ? " chunked " : " scan ") << to_string(mode));
        auto backend = make_backend("cuda", BackendOptions{});
        const test::Outcome r = test::run_layer_twice(*backend, p, mode);
        std::string errors;
        for (const auto& [name, err] : r.check.per_output) errors += fmt::format("{}={:.2e} ", name, err);
        INFO(errors);
        CHECK(r.check.non_finite.empty());
        CHECK(r.check.passed);
        CHECK(r.check.per_output.size() == (mode == Mode::fwd ? 1u : 8u));
        CHECK(r.memory.temp_bytes == test::expected_cuda_layer_scratch(p, mode == Mode::fwd_bwd));
      }
}

TEST_CASE("the CUDA backend runs the layer suite (no skipped cases) and reports its scratch", "[cuda][layer][cli][spawns]") {
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
