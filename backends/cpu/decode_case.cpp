#include "backends/cpu/decode_case.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "backends/cpu/cold.hpp"
#include "backends/cpu/host_case.hpp"
#include "backends/cpu/roofline.hpp"
#include "core/op.hpp"
#include "core/random.hpp"
#include "kernels/decode/cpu.hpp"
#include "kernels/decode/op.hpp"
#include "src/run/in_place_case.hpp"

namespace lattn::cpu {
namespace {

// The tensors a step reads besides the states (h0 is the pristine copy, read only when re-seeding;
// state_index is shared by the copies: an engine's index array is one small tensor).
constexpr const char* kCopiedInputs[] = {"q", "k", "v", "g", "beta", "a", "b", "dt", "trap", "k_prev", "v_prev"};
constexpr const char* kCopiedOutputs[] = {"o", "snapshots", "k_last", "v_last"};

std::size_t elems_of(const Case& c, const std::string& name) {
  for (const TensorSpec& spec : c.op->tensors)
    if (spec.name == name && spec.in(c)) {
      std::size_t n = 1;
      for (std::size_t e : spec.shape(c)) n *= e;
      return n;
    }
  return 0;
}

std::size_t state_bytes(const DecodeProblem& p) { return p.state_bf16 ? 2 : 4; }

// One copy's bytes: its inputs and outputs and its pool.
std::size_t copy_bytes(const Case& c) {
  const DecodeProblem p = decode_problem(c);
  std::size_t floats = 0;
  for (const char* name : kCopiedInputs) floats += elems_of(c, name);
  for (const char* name : kCopiedOutputs) floats += elems_of(c, name);
  return floats * sizeof(float) + p.pool_elems() * state_bytes(p);
}

// What one call touches of its copy: the above, with only the batch's slots of the pool.
std::size_t touched_bytes(const Case& c) {
  const DecodeProblem p = decode_problem(c);
  return copy_bytes(c) - (p.pool_elems() - p.state_elems()) * state_bytes(p);
}

struct Plan {
  std::size_t copies = 1;
  bool evict = false;
};

Plan plan_for(const Case& c) {
  if (!cache_cold(c)) return {};
  const std::size_t copies = cold_copies(touched_bytes(c), machine_last_level_cache_bytes());
  if (!rotation_fits(copies * copy_bytes(c))) return {1, true};
  return {copies, false};
}

// 64-byte aligned storage of one copy (copies 1..N-1; copy 0 is the HostCase's own tensors).
template <class T>
struct Lines {
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T, Free> data;
  std::size_t size = 0;
  explicit Lines(std::size_t n) : size(n) {
    const std::size_t bytes = std::max<std::size_t>(64, (n * sizeof(T) + 63) / 64 * 64);
    data.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!data) throw std::bad_alloc();
    std::fill(data.get(), data.get() + n, T(0));
  }
  T* get() const { return data.get(); }
};

// The copies' states and buffers, and which copy the next call steps.
struct Rotation {
  DecodeProblem problem;
  std::vector<DecodeArgs<float>> args;  // per copy
  std::vector<Lines<float>> buffers;    // copies 1..: their inputs and outputs
  std::vector<Lines<float>> pools;      // float32 states, per copy
  std::vector<Lines<std::uint16_t>> bf16_pools;
  std::vector<int> index;  // state_index as ints; empty without a pool
  const float* h0 = nullptr;
  std::size_t next = 0;

  std::size_t pool_bytes() const { return problem.pool_elems() * (problem.state_bf16 ? 2 : 4); }

  // Every copy's batch slots from h0 (the other slots of a pool are left as they are: no step reads them).
  void reseed() {
    const std::size_t DD = problem.head_state_elems();
    for (const DecodeArgs<float>& a : args)
      for (std::size_t bh = 0; bh < problem.heads_total(); ++bh) {
        const float* from = h0 + bh * DD;
        const std::size_t at = problem.state_offset(bh, a.state_index);
        if (problem.state_bf16)
          std::transform(from, from + DD, a.state_bf16 + at, float_to_bf16_bits);
        else
          std::copy(from, from + DD, a.state + at);
      }
    next = 0;
  }

  // Copy 0's new states, gathered from their slots into hT's [batch][H][Dk][Dv].
  void gather(std::vector<float>& hT) const {
    const std::size_t DD = problem.head_state_elems();
    const DecodeArgs<float>& a = args.front();
    hT.resize(problem.state_elems());
    for (std::size_t bh = 0; bh < problem.heads_total(); ++bh) {
      const std::size_t at = problem.state_offset(bh, a.state_index);
      if (problem.state_bf16)
        std::transform(a.state_bf16 + at, a.state_bf16 + at + DD, hT.begin() + std::ptrdiff_t(bh * DD),
                       bf16_bits_to_float);
      else
        std::copy(a.state + at, a.state + at + DD, hT.begin() + std::ptrdiff_t(bh * DD));
    }
  }
};

class DecodeCase final : public PreparedCase {
 public:
  DecodeCase(const Case& c, const TensorSet& inputs) : host_(std::make_unique<HostCase>(c, inputs)) {
    const Plan plan = plan_for(c);
    evict_ = plan.evict;
    auto r = std::make_shared<Rotation>();
    r->problem = decode_problem(c);
    const DecodeProblem& p = r->problem;
    HostCase& h = *host_;
    r->h0 = h.data("h0");
    if (p.pooled()) {
      const float* index = h.data("state_index");
      r->index.assign(index, index + p.batch);
    }
    const auto present = [&](const char* name) { return elems_of(c, name) > 0; };
    for (std::size_t copy = 0; copy < plan.copies; ++copy) {
      DecodeArgs<float> a{};
      if (copy == 0) {
        a.q = h.data("q"), a.k = h.data("k"), a.v = h.data("v"), a.o = h.data("o");
        a.g = present("g") ? h.data("g") : nullptr;
        a.beta = present("beta") ? h.data("beta") : nullptr;
        a.a = present("a") ? h.data("a") : nullptr;
        a.b = present("b") ? h.data("b") : nullptr;
        a.snapshots = present("snapshots") ? h.data("snapshots") : nullptr;
        if (present("dt")) {  // rule trapezoidal
          a.dt = h.data("dt"), a.trap = h.data("trap"), a.k_prev = h.data("k_prev"), a.v_prev = h.data("v_prev");
          a.k_last = h.data("k_last"), a.v_last = h.data("v_last");
        }
      } else {
        // Its inputs copied from copy 0's, its outputs its own, in one block.
        std::size_t floats = 0;
        for (const char* name : kCopiedInputs) floats += elems_of(c, name);
        for (const char* name : kCopiedOutputs) floats += elems_of(c, name);
        r->buffers.emplace_back(floats);
        float* at = r->buffers.back().get();
        const auto take = [&](const char* name, bool input) -> float* {
          const std::size_t n = elems_of(c, name);
          if (n == 0) return nullptr;
          float* mine = at;
          at += n;
          if (input) std::copy(h.data(name), h.data(name) + n, mine);
          return mine;
        };
        a.q = take("q", true), a.k = take("k", true), a.v = take("v", true);
        a.g = take("g", true), a.beta = take("beta", true);
        a.a = take("a", true), a.b = take("b", true);
        a.o = take("o", false), a.snapshots = take("snapshots", false);
        a.dt = take("dt", true), a.trap = take("trap", true), a.k_prev = take("k_prev", true);
        a.v_prev = take("v_prev", true), a.k_last = take("k_last", false), a.v_last = take("v_last", false);
      }
      // The bonus u ([H][Dk], read once per step) is shared by the copies.
      a.u = present("u") ? h.data("u") : nullptr;
      if (p.state_bf16) {
        r->bf16_pools.emplace_back(p.pool_elems());
        a.state_bf16 = r->bf16_pools.back().get();
        a.state = nullptr;
      } else {
        r->pools.emplace_back(p.pool_elems());
        a.state = r->pools.back().get();
      }
      r->args.push_back(a);
    }
    for (DecodeArgs<float>& a : r->args) a.state_index = r->index.empty() ? nullptr : r->index.data();
    h.bind([r](Allocator& allocator) {
      decode_step(r->problem, r->args[r->next], allocator);
      r->next = (r->next + 1) % r->args.size();
    });
    rotation_ = r;
  }

  void reseed() { rotation_->reseed(); }
  void run() override { host_->run(); }
  double time_ms(int calls) override {
    if (!evict_) return host_->time_ms(calls);
    double total = 0;
    for (int i = 0; i < calls; ++i) {
      evict_caches();
      const auto start = std::chrono::steady_clock::now();
      host_->run();
      total += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    return total;
  }
  // The HostCase's hT is only where the check's states are gathered to, never touched by a step:
  // the pools stand in its place as outputs; the other copies' tensors are counted with the inputs.
  MemoryUsage memory() const override {
    MemoryUsage m = host_->memory();
    const Rotation& r = *rotation_;
    const std::size_t hT = r.problem.state_elems() * sizeof(float);
    m.out_bytes = m.out_bytes - hT + r.pool_bytes() * r.args.size();
    for (const auto& b : r.buffers) m.arg_bytes += b.size * sizeof(float);
    return m;
  }
  void read_outputs(TensorSet& outputs) override {
    host_->read_outputs(outputs);
    rotation_->gather(outputs.at("hT").data);
  }

 private:
  std::unique_ptr<HostCase> host_;
  std::shared_ptr<Rotation> rotation_;
  bool evict_ = false;
};

}  // namespace

std::size_t decode_case_copies(const Case& kase) { return plan_for(kase).copies; }

std::size_t decode_case_bytes(const Case& kase, int threads) {
  const Plan plan = plan_for(kase);
  return host_tensor_bytes(kase) + plan.copies * copy_bytes(kase) +
         decode_step_workspace_bytes(decode_problem(kase), threads) + (plan.evict ? eviction_bytes() : 0);
}

std::unique_ptr<PreparedCase> make_decode_case(const Case& kase, const TensorSet& inputs) {
  auto inner = std::make_unique<DecodeCase>(kase, inputs);
  DecodeCase* self = inner.get();
  return std::make_unique<InPlaceCase>(std::move(inner), [self] { self->reseed(); });
}

}  // namespace lattn::cpu
