#include "transport/ucx/ucx_peers.h"

#include "core/error.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_memory.h"

namespace tessera::transport {
namespace {

std::string rank_key(const std::string& job, int rank, const std::string& what) {
  return job + "/" + std::to_string(rank) + "/" + what;
}

}  // namespace

UcxPeers::UcxPeers(UcxContext& context, std::shared_ptr<Store> store, std::string job, int rank, int size,
                   const std::string& name_space)
    : context_(context), store_(store->shared(name_space)), job_(std::move(job)), rank_(rank), size_(size) {
  if (size < 1 || rank < 0 || rank >= size)
    throw TransportError("UCX peers of job '" + job_ + "': rank " + std::to_string(rank) + " not in 0.." +
                         std::to_string(size - 1));
  store_->set(job_ + "/size", std::to_string(size));
  store_->set(rank_key(job_, rank_, "address"), context_.worker_address());
}

UcxPeers::~UcxPeers() {
  keys_.clear();  // remote keys before their endpoints
  endpoints_.clear();
}

int UcxPeers::connect(const std::string& job) {
  int size = 0;
  try {
    size = std::stoi(store_->get_string(job + "/size"));
  } catch (const TimeoutError& e) {
    throw TimeoutError("UCX peers: job '" + job + "' never published its size (is it running and using the same "
                       "store and namespace?): " + e.what());
  }
  for (int r = 0; r < size; ++r) {
    auto key = std::make_pair(job, r);
    if (endpoints_.count(key)) continue;
    auto address = store_->get(rank_key(job, r, "address"));
    endpoints_[key] = std::make_unique<UcxEndpoint>(context_, address, "job '" + job + "' rank " + std::to_string(r));
  }
  return size;
}

UcxEndpoint& UcxPeers::endpoint(const std::string& job, int rank) {
  auto it = endpoints_.find({job, rank});
  if (it == endpoints_.end())
    throw TransportError("UCX peers of job '" + job_ + "' rank " + std::to_string(rank_) + ": no endpoint to job '" +
                         job + "' rank " + std::to_string(rank) + " (call connect(\"" + job + "\") first)");
  return *it->second;
}

void UcxPeers::publish_memory(const std::string& name, const UcxMemory& memory) {
  store_->set(rank_key(job_, rank_, "memory/" + name), memory.descriptor());
}

const UcxRemoteKey& UcxPeers::remote_key(const std::string& job, int rank, const std::string& name) {
  auto key = std::make_tuple(job, rank, name);
  auto it = keys_.find(key);
  if (it != keys_.end()) return *it->second;
  auto& ep = endpoint(job, rank);
  auto descriptor = store_->get(rank_key(job, rank, "memory/" + name));
  return *(keys_[key] = std::make_unique<UcxRemoteKey>(ep, descriptor));
}

}  // namespace tessera::transport
