#include "actors/engine/sigterm_flag.h"

#include <signal.h>

#include <atomic>
#include <cstring>

#include "core/error.h"

namespace tessera {
namespace {

volatile sig_atomic_t received = 0;

void on_sigterm(int) { received = 1; }

}  // namespace

void install_sigterm_flag() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction action;
  std::memset(&action, 0, sizeof action);
  action.sa_handler = on_sigterm;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // the collectives' reads and writes go on
  if (::sigaction(SIGTERM, &action, nullptr) != 0) throw Error("initialize: cannot install the SIGTERM handler");
}

bool sigterm_received() { return received != 0; }

}  // namespace tessera
