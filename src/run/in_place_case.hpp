// A prepared case whose kernel updates one of its tensors in place, as the decode step does with
// its state (kernels/decode): the backend keeps the pristine input (h0) and a working copy (hT),
// and the kernel steps the working copy call after call, as an engine steps a sequence. This
// wrapper re-seeds the working copy from the pristine one, always outside the timed region:
//   - when it is made, so that the cold call starts from h0;
//   - before a sample once kMaxStepsBetweenSeeds calls have stepped it (a state without decay
//     grows by k v^T with every call: re-seeding keeps its values where the inputs put them);
//   - in read_outputs, which re-seeds, makes one more call and reads that call's outputs, so that
//     the check compares one step from h0 with the float64 reference, whatever the timing did.
// docs/harness.md ("In-place cases") says the same for the records' readers.
#pragma once

#include <functional>
#include <memory>
#include <utility>

#include "src/run/backend.hpp"

namespace lattn {

class InPlaceCase final : public PreparedCase {
 public:
  static constexpr long kMaxStepsBetweenSeeds = 4096;
  using Reseed = std::function<void()>;

  InPlaceCase(std::unique_ptr<PreparedCase> inner, Reseed reseed) : inner_(std::move(inner)), reseed_(std::move(reseed)) {
    reseed_();
  }

  void run() override {
    inner_->run();
    ++steps_;
  }
  double time_ms(int calls) override {
    if (steps_ >= kMaxStepsBetweenSeeds) {
      reseed_();
      steps_ = 0;
    }
    const double ms = inner_->time_ms(calls);
    steps_ += calls;
    return ms;
  }
  void watch_scratch() override {
    inner_->watch_scratch();
    ++steps_;
  }
  MemoryUsage memory() const override { return inner_->memory(); }
  void read_outputs(TensorSet& outputs) override {
    reseed_();
    inner_->run();
    steps_ = 1;
    inner_->read_outputs(outputs);
  }
  std::string bwd_states() const override { return inner_->bwd_states(); }

 private:
  std::unique_ptr<PreparedCase> inner_;
  Reseed reseed_;
  long steps_ = 0;
};

}  // namespace lattn
