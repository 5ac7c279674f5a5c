#include "interrupt.hpp"

#include <csignal>

namespace lattn {
namespace {
volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_signal(int signal) { g_signal = signal; }
}  // namespace

void install_interrupt_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // one-shot: the second Ctrl-C is the default, immediate one
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

int interrupt_signal() { return g_signal; }
void clear_interrupt() { g_signal = 0; }

}  // namespace lattn
