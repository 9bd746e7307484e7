// A UcxContext is this process's one UCX context and worker (UCP), in an RAII wrapper.
//
// One per process: every endpoint, registered buffer and transfer between jobs hangs off it, and
// its worker is progressed in exactly one place (the owner's thread or actor). UCX 1.13 on one
// machine picks shared memory and CMA, where one-sided puts are emulated: the target must keep
// progressing its worker while data arrives.
//
// Example: UcxContext ctx({}); ctx.worker() is ready for ucp_ep_create; ucx_transports() lists
// e.g. {"self/memory", "tcp/lo", "sysv/memory", "posix/memory", "cma/memory"}.
#pragma once

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

 private:
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
};

// The UCX library version ("1.13.1").
std::string ucx_version();

// Every transport/device pair UCX can use on this machine ("tcp/lo", "cma/memory", ...).
std::vector<std::string> ucx_transports();

}  // namespace tessera::transport
