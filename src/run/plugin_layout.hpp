// An impl that takes its per-token tensors in another order than lattnbench's (PluginLayout::bthd,
// flash-linear-attention's [B, T, H, ...]) is handed them in that order by its row: the row
// prepares its case on permuted copies of the inputs (before the first call), and the prepared
// case permutes the outputs back when the runner reads them (after the last), so that no timed
// call includes the copy and the check sees the outputs in the reference's layout. The copy's
// bytes are the record's `layout_copy_mb` (docs/results.md).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/case.hpp"
#include "core/tensor_set.hpp"
#include "src/plugins/plugins.hpp"
#include "src/run/backend.hpp"

namespace lattn {

std::string to_string(PluginLayout layout);  // "BHTD", "BTHD"

// Whether the tensor `name` is a per-token one ([B, H, T, ...]: q k v o and their gradients, g, beta,
// dplr's a and b, the trapezoidal rule's dt and trap, and theirs), which a layout permutes. States,
// gamma and the bonus u are per head, the same in both layouts.
bool is_per_token(const std::string& name);

// Whether the plugin interface has the tensor `name` in the case's dtype (q k v o dO dq dk dv: a
// bf16 case's are bf16; include/lattn/plugin.h); the others are float32.
bool in_plugin_dtype(const std::string& name);

// Permutes a per-token tensor's values between [B, H, T, ...] (its shape, which stays as it is)
// and [B, T, H, ...]: `to_impl` true towards the impl's layout, false back.
void permute_tensor(Tensor& t, PluginLayout layout, bool to_impl);

// Bytes the conversion moves once: each per-token tensor the impl reads (inputs and cotangents)
// or writes (outputs and gradients) of the case, at the size the interface has it (2 bytes for a
// bf16 case's tensors in_plugin_dtype, 4 otherwise); 0 for the bhtd layout.
std::size_t layout_copy_bytes(const Case& kase, PluginLayout layout);

// The row's prepare for an impl of `layout`: `make` prepares the case on the inputs it is given
// (the row's own prepare); for bthd it gets the permuted copies and the result permutes the
// outputs back in read_outputs and reports the layout and its bytes in memory().
std::unique_ptr<PreparedCase> prepare_in_layout(
    PluginLayout layout, const Case& kase, const TensorSet& inputs,
    const std::function<std::unique_ptr<PreparedCase>(const TensorSet&)>& make);

}  // namespace lattn
