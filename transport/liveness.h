// Liveness: how a launcher tells a stopped or hung rank from a slow one, in seconds rather than
// at the end of a 300 s collective timeout.
//
// Every rank started by tessera-launch gets a socket in TESSERA_HEARTBEAT_FD. start_heartbeat()
// (called by the first store or communicator of the process; idempotent) starts one dedicated
// thread that writes a line to it every TESSERA_HEARTBEAT_INTERVAL_MS (default 1000):
//   "beat" [" " <the collectives this process has been running for over a second>] "\n"
// A process frozen by SIGSTOP, or one whose threads cannot run, stops beating; one waiting in a
// long collective keeps beating (and says what it waits in). The launcher, which owns the
// processes' lifetime, ends the job when a rank that has beaten falls silent for its
// --heartbeat-timeout, naming the silent rank and what the others wait in. Library code never
// exits the process. Without TESSERA_HEARTBEAT_FD nothing beats.
//
// Example beat of rank 0 while rank 1 is stopped: "beat communicator 'engine0.grad' (gloo, job
// 'default', rank 0 of 2): all_reduce #17 for 4.0 s".
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace tessera::transport {

void start_heartbeat();

// Registers an operation as running in this process for its lifetime (the communicators'
// sequencers hold one around every backend operation). `describe` is called only when the
// operation is reported (it has run for a while), so a fast collective builds no string.
class RunningOperation {
 public:
  explicit RunningOperation(std::function<std::string()> describe);
  ~RunningOperation();
  RunningOperation(const RunningOperation&) = delete;
  RunningOperation& operator=(const RunningOperation&) = delete;

 private:
  uint64_t id_;
};

// The operations running for at least `older_than`, "<what> for <s> s" joined by "; ".
std::string running_operations(std::chrono::milliseconds older_than);

}  // namespace tessera::transport
