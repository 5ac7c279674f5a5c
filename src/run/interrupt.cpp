#include "src/run/interrupt.hpp"

#include <csignal>

namespace lattn {
namespace {
extern "C" void on_signal(int signal) { request_stop(signal); }
}  // namespace

void install_interrupt_handlers() {
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // one-shot: the second Ctrl-C is the default, immediate one
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

}  // namespace lattn
