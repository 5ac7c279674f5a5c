// SIGINT and SIGTERM ask the run to stop after the current sample; the cases already finished are
// written as usual (marked interrupted) and the process exits 128 + the signal. The handler is
// one-shot: a second signal kills at once, which the journal survives.
#pragma once

#include <stdexcept>

namespace lattn {

void install_interrupt_handlers();
// The signal that asked to stop, or 0.
int interrupt_signal();
// For tests: forget a recorded signal.
void clear_interrupt();

struct Interrupted : std::runtime_error {
  Interrupted() : std::runtime_error("interrupted") {}
};

// Throws Interrupted when a stop was asked for.
inline void throw_if_interrupted() {
  if (interrupt_signal() != 0) throw Interrupted();
}

}  // namespace lattn
