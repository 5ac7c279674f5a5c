// SIGINT and SIGTERM ask the run to stop (core/cancel.hpp): the sample or warm-up batch under way
// finishes, a float64 reference under way ends early, the cases already finished are written as
// usual (marked interrupted) and the process exits 128 + the signal. The handler is one-shot: a
// second signal kills at once, which the journal survives.
#pragma once

#include "core/cancel.hpp"

namespace lattn {

void install_interrupt_handlers();

}  // namespace lattn
