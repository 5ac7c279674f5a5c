#include "src/run/plugin_layout.hpp"

#include <utility>
#include <vector>

#include "core/error.hpp"
#include "core/op.hpp"

namespace lattn {

std::string to_string(PluginLayout layout) { return layout == PluginLayout::bthd ? "BTHD" : "BHTD"; }

bool is_per_token(const std::string& name) {
  for (const char* n : {"q", "k", "v", "g", "beta", "o", "dO", "dq", "dk", "dv", "dg", "dbeta", "a", "b", "da", "db",
                        "dt", "trap", "ddt", "dtrap"})
    if (name == n) return true;
  return false;
}

bool in_plugin_dtype(const std::string& name) {
  for (const char* n : {"q", "k", "v", "o", "dO", "dq", "dk", "dv"})
    if (name == n) return true;
  return false;
}

void permute_tensor(Tensor& t, PluginLayout layout, bool to_impl) {
  if (layout == PluginLayout::bhtd || !is_per_token(t.name)) return;
  if (t.shape.size() < 3) throw RuntimeFailure("layout: tensor '" + t.name + "' is not [B, H, T, ...]");
  const std::size_t batch = t.shape[0], heads = t.shape[1], seq = t.shape[2];
  const std::size_t row = elems_of(t.shape) / (batch * heads * seq);  // D, or 1 for [B, H, T]
  std::vector<float> permuted(t.data.size());
  for (std::size_t b = 0; b < batch; ++b)
    for (std::size_t h = 0; h < heads; ++h)
      for (std::size_t s = 0; s < seq; ++s) {
        const std::size_t ours = ((b * heads + h) * seq + s) * row;    // [B, H, T, ...]
        const std::size_t theirs = ((b * seq + s) * heads + h) * row;  // [B, T, H, ...]
        const std::size_t from = to_impl ? ours : theirs, to = to_impl ? theirs : ours;
        for (std::size_t i = 0; i < row; ++i) permuted[to + i] = t.data[from + i];
      }
  t.data = std::move(permuted);
}

std::size_t layout_copy_bytes(const Case& kase, PluginLayout layout) {
  if (layout == PluginLayout::bhtd) return 0;
  std::size_t bytes = 0;
  for (const TensorSpec& spec : kase.op->tensors)
    if (spec.in(kase) && is_per_token(spec.name))
      bytes += elems_of(spec.shape(kase)) * (kase.dtype == "bf16" && in_plugin_dtype(spec.name) ? 2 : 4);
  return bytes;
}

namespace {

class LayoutCase final : public PreparedCase {
 public:
  LayoutCase(std::unique_ptr<PreparedCase> inner, PluginLayout layout, std::size_t bytes)
      : inner_(std::move(inner)), layout_(layout), bytes_(bytes) {}

  void run() override { inner_->run(); }
  double time_ms(int calls) override { return inner_->time_ms(calls); }
  // A Python impl's scratch is watched in a call of its own (tracemalloc, torch.cuda), inside.
  void watch_scratch() override { inner_->watch_scratch(); }
  MemoryUsage memory() const override {
    MemoryUsage m = inner_->memory();
    m.layout = to_string(layout_);
    m.layout_copy_bytes = bytes_;
    return m;
  }
  void read_outputs(TensorSet& outputs) override {
    inner_->read_outputs(outputs);
    for (const Tensor& t : outputs) permute_tensor(*outputs.find(t.name), layout_, false);
  }
  std::string bwd_states() const override { return inner_->bwd_states(); }

 private:
  std::unique_ptr<PreparedCase> inner_;
  PluginLayout layout_;
  std::size_t bytes_;
};

}  // namespace

std::unique_ptr<PreparedCase> prepare_in_layout(
    PluginLayout layout, const Case& kase, const TensorSet& inputs,
    const std::function<std::unique_ptr<PreparedCase>(const TensorSet&)>& make) {
  if (layout == PluginLayout::bhtd) return make(inputs);
  TensorSet permuted = inputs;
  for (const Tensor& t : inputs) permute_tensor(*permuted.find(t.name), layout, true);
  return std::make_unique<LayoutCase>(make(permuted), layout, layout_copy_bytes(kase, layout));
}

}  // namespace lattn
