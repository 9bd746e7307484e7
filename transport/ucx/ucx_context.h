// A UcxContext is this process's one UCX context and worker (UCP), in an RAII wrapper.
//
// One per process: every endpoint, registered buffer and transfer between jobs hangs off it, and
// its worker is progressed in exactly one place: `progress()`/`wait()` here, called from the
// owner's thread or actor (the worker is single-threaded). UCX 1.13 on one machine picks shared
// memory and CMA, where one-sided puts are emulated: the target must keep progressing its worker
// while data arrives (a process waiting in `wait()` does).
//
// Transports: UcxContextOptions::transports (the tessera setting tessera.transport.ucx_tls) wins;
// empty keeps UCX_TLS from the environment or UCX's default, which on one machine without RDMA is
// shared memory (sysv/posix), CMA and TCP on loopback.
//
// Example: UcxContext ctx({}); ctx.worker() is ready for ucp_ep_create; ucx_transports() lists
// e.g. {"self/memory", "tcp/lo", "sysv/memory", "posix/memory", "cma/memory"}.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

typedef struct ucp_context* ucp_context_h;
typedef struct ucp_worker* ucp_worker_h;

namespace tessera::transport {

struct UcxContextOptions {
  // Value for UCX_TLS ("" keeps UCX's default: on one machine shared memory, CMA and TCP).
  std::string transports;
  bool enable_tag = true;
  bool enable_rma = true;
};

class UcxContext {
 public:
  explicit UcxContext(const UcxContextOptions& options);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;

  ucp_context_h context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }

  // This worker's address, to publish through the store (peers create endpoints from it).
  std::vector<uint8_t> worker_address() const;
  // Progresses the worker once; returns whether anything happened.
  bool progress();
  // Progresses until `request` (a ucp request pointer or status pointer) completes; throws
  // TransportError on failure and TimeoutError (after cancelling it) when `timeout` passes.
  // `what` names the operation in errors. For a tagged receive, `received_bytes` gets the length.
  void wait(void* request, std::chrono::milliseconds timeout, const std::string& what,
            size_t* received_bytes = nullptr);

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
};

// The UCX library version ("1.13.1").
std::string ucx_version();

// Every transport/device pair UCX can use on this machine ("tcp/lo", "cma/memory", ...).
std::vector<std::string> ucx_transports();

}  // namespace tessera::transport
