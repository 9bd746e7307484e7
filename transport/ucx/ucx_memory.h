// A UcxMemory is a buffer registered with UCX so that peers can put into and get from it.
//
// Registration pins the pages and yields a remote key; `descriptor()` packs base address, length
// and remote key into bytes to publish through the store. A peer turns those bytes into a
// UcxRemoteKey for its endpoint to this process (ucx_endpoint.h) and then addresses the buffer by
// offset. The memory is owned by the caller (e.g. a tensor's storage) unless `allocate` was used;
// it must outlive the registration, and the registration must outlive every peer's use of it.
//
// Example: a 3-rank rollout job registers its 64 MiB weight buffer, sets
// "ucx/rollout/2/weights" = descriptor() (about 100 bytes on shm+cma), and the training ranks
// put their shards into it at the offsets their plans say.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

typedef struct ucp_mem* ucp_mem_h;

namespace tessera::transport {

class UcxContext;

class UcxMemory {
 public:
  // Registers [address, address + bytes) (bytes may be 0: nothing to register).
  UcxMemory(UcxContext& context, void* address, size_t bytes);
  // Allocates `bytes` through UCX (ucp_mem_map ALLOCATE) and registers them. On one machine UCX
  // places them in shared memory, so peers' puts land with one copy instead of being emulated
  // over active messages: the fast choice for a target buffer (a rollout engine's weights).
  static std::unique_ptr<UcxMemory> allocate(UcxContext& context, size_t bytes);
  ~UcxMemory();
  UcxMemory(const UcxMemory&) = delete;
  UcxMemory& operator=(const UcxMemory&) = delete;

  void* address() const { return address_; }
  size_t bytes() const { return bytes_; }
  ucp_mem_h handle() const { return memh_; }
  // base address (8 bytes) + length (8 bytes) + packed remote key.
  std::vector<uint8_t> descriptor() const;

 private:
  UcxContext& context_;
  void* address_;
  size_t bytes_;
  ucp_mem_h memh_ = nullptr;

  struct Allocated {};
  UcxMemory(UcxContext& context, size_t bytes, Allocated);
};

}  // namespace tessera::transport
