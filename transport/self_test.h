// The transport self test: a live multi-process check for `tessera doctor`.
//
// It forks `processes` local processes (default 2) that meet through a TCP store on 127.0.0.1
// (a free port), build a Gloo communicator and check an all-reduce and a reduce-scatter against
// their closed forms, then (ranks 0 and 1) a UCX put of 1 MiB + 3 bytes into a registered buffer,
// checked bitwise. The calling process takes no part beyond collecting one line per check; every
// child is bounded by `timeout` and killed (SIGKILL, by pid) if it overruns.
//
// fork() from a process that already runs threads copies only the calling thread; the children
// use no lock held elsewhere at that moment except LibTorch's and UCX's own initialization, so
// call this before starting an actor system or thread pools when you can (the doctor does it
// first among its live checks).
//
// Example: auto r = run_transport_self_test({}); r.ok == true, r.lines ==
//   {"store: 2 processes met on 127.0.0.1:41237", "gloo all_reduce: ok (1048583 floats)",
//    "gloo reduce_scatter: ok", "ucx put: ok (1048579 bytes, 0.8 ms)"}.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace tessera::transport {

struct SelfTestOptions {
  int processes = 2;
  // Store port on 127.0.0.1; 0 picks a free one.
  int port = 0;
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
  // Elements per rank of the all-reduce.
  size_t elements = (1 << 20) + 7;
  // UCX_TLS for the UCX part ("" = UCX's default).
  std::string ucx_transports;
};

struct SelfTestReport {
  bool ok = false;
  // One line per check, in order ("gloo all_reduce: ok (...)" or "... FAILED: why").
  std::vector<std::string> lines;
  double seconds = 0;
};

// Runs the self test; never throws (failures are in the report).
SelfTestReport run_transport_self_test(const SelfTestOptions& options = {});

}  // namespace tessera::transport
