// A UcxPeers is this process's directory of UCX endpoints to the ranks of its own job and of
// other jobs: (job, rank) -> endpoint, built through a shared store namespace.
//
// Every process publishes its worker address under "shared/<namespace>/<job>/<rank>/address"
// (and its job's world size under ".../<job>/size"), then connects to the jobs it needs by name.
// Two separately launched jobs of different sizes (2 training ranks, 3 rollout ranks) meet this
// way as long as they reach the same store (one TCP store server, e.g. the first job's rank 0)
// and use the same namespace. Buffers are published the same way: `publish_memory(name, memory)`
// and `remote_key(job, rank, name)`.
//
// Contract: `connect(job)` waits (bounded by the store timeout) until every rank of that job has
// published; there is no ordering requirement between jobs. Endpoints live as long as the
// UcxPeers; all calls come from the thread that progresses the context.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "transport/ucx/ucx_endpoint.h"

namespace tessera::transport {

class Store;
class UcxContext;
class UcxMemory;

class UcxPeers {
 public:
  // Publishes this process's address as (job, rank) of a job of `size` ranks. `store` is any
  // handle on the store; keys go to its shared namespace `name_space`.
  UcxPeers(UcxContext& context, std::shared_ptr<Store> store, std::string job, int rank, int size,
           const std::string& name_space = "ucx");
  ~UcxPeers();

  // Connects to every rank of `job` (this job included: to itself through UCX's "self"); returns
  // that job's size.
  int connect(const std::string& job);
  UcxEndpoint& endpoint(const std::string& job, int rank);

  // Publishes a registered buffer under `name`.
  void publish_memory(const std::string& name, const UcxMemory& memory);
  // The remote key of buffer `name` of (job, rank), unpacked once and cached.
  const UcxRemoteKey& remote_key(const std::string& job, int rank, const std::string& name);

  const std::string& job() const { return job_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  UcxContext& context() const { return context_; }
  const std::shared_ptr<Store>& store() const { return store_; }

 private:
  UcxContext& context_;
  std::shared_ptr<Store> store_;  // the shared namespace
  std::string job_;
  int rank_;
  int size_;
  std::map<std::pair<std::string, int>, std::unique_ptr<UcxEndpoint>> endpoints_;
  std::map<std::tuple<std::string, int, std::string>, std::unique_ptr<UcxRemoteKey>> keys_;
};

}  // namespace tessera::transport
