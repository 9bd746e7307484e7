// A UcxEndpoint is this process's connection to one peer worker (of this job or another), and a
// UcxRemoteKey is a peer's registered buffer as seen through that endpoint.
//
// Operations are blocking with a timeout and progress this process's worker while they wait
// (UcxContext::wait): put/get move bytes one-sidedly into/out of the peer's registered buffer;
// put completes locally, `flush()` makes every earlier put visible at the target (do it before
// telling the target "done"). Tagged send/receive match on a 64-bit tag; `UcxContext`-level
// receive takes a message from any endpoint. The peer must progress its worker meanwhile (on one
// machine RMA is emulated over shared memory and CMA).
//
// Contract: all calls on one UcxContext and its endpoints come from one thread (the worker is
// single-threaded). Timeouts throw tessera::TimeoutError naming the operation and the peer.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

typedef struct ucp_ep* ucp_ep_h;
typedef struct ucp_rkey* ucp_rkey_h;

namespace tessera::transport {

class UcxContext;
class UcxEndpoint;

// A UcxRequest is a pending non-blocking send or receive. `wait` progresses the worker until it
// completes (returning the received length for a receive, the sent one for a send) or throws
// TimeoutError after `timeout` (the request is cancelled). Destroying a pending request cancels it.
class UcxRequest {
 public:
  UcxRequest(UcxContext& context, void* request, std::string what, size_t bytes, bool is_receive);
  ~UcxRequest();
  UcxRequest(UcxRequest&& other) noexcept;
  UcxRequest(const UcxRequest&) = delete;
  UcxRequest& operator=(const UcxRequest&) = delete;
  UcxRequest& operator=(UcxRequest&&) = delete;

  size_t wait(std::chrono::milliseconds timeout);

 private:
  UcxContext* context_;
  void* request_;
  std::string what_;
  size_t bytes_;
  bool is_receive_;
};

class UcxRemoteKey {
 public:
  // Unpacks a UcxMemory::descriptor() of the peer behind `endpoint`.
  UcxRemoteKey(UcxEndpoint& endpoint, const std::vector<uint8_t>& descriptor);
  ~UcxRemoteKey();
  UcxRemoteKey(const UcxRemoteKey&) = delete;
  UcxRemoteKey& operator=(const UcxRemoteKey&) = delete;

  uint64_t base() const { return base_; }
  size_t bytes() const { return bytes_; }
  ucp_rkey_h handle() const { return rkey_; }
  // Where the buffer's byte `offset` is in this process, when UCX maps the peer's buffer here
  // (ucp_rkey_ptr: memory the peer allocated through UCX, on the same machine, is shared memory
  // attached by unpacking this key); nullptr otherwise. Stores through it are the peer's bytes,
  // visible to it after a fence (what UCX's own put into that memory does).
  void* mapped(size_t offset) const;

 private:
  uint64_t base_ = 0;
  size_t bytes_ = 0;
  ucp_rkey_h rkey_ = nullptr;
};

class UcxEndpoint {
 public:
  // Connects to the worker at `peer_address` (UcxContext::worker_address() of the peer);
  // `peer_name` ("rollout rank 2") goes into errors.
  UcxEndpoint(UcxContext& context, const std::vector<uint8_t>& peer_address, std::string peer_name);
  ~UcxEndpoint();  // waits for put_nowait requests (bounded), then force-closes; never throws.
                   // Call flush() first when the peer must see every earlier put.
  UcxEndpoint(const UcxEndpoint&) = delete;
  UcxEndpoint& operator=(const UcxEndpoint&) = delete;

  // Copies `bytes` from `local` into the peer's buffer at `offset`. `local_memh` may be null.
  void put(const void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset,
           std::chrono::milliseconds timeout);
  // The same without waiting for local completion: up to `kMaxPending` puts stay in flight (the
  // oldest is waited for beyond that); `local` must stay unchanged until `flush()` returned,
  // unless this returned true: the put completed in place (UCX copied `local` out already, as a
  // put into a peer's shared memory does), so `local` may be reused at once (the bytes are
  // visible at the peer after `flush()` either way). Back-to-back puts this way pipeline like
  // ucx_perftest's ucp_put_bw.
  bool put_nowait(const void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset,
                  std::chrono::milliseconds timeout);
  static constexpr size_t kMaxPending = 64;
  // Copies `bytes` of the peer's buffer at `offset` into `local`.
  void get(void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset, std::chrono::milliseconds timeout);
  // Waits until every earlier put/get through this endpoint (put_nowait included) is complete at
  // the peer.
  void flush(std::chrono::milliseconds timeout);
  // Sends `bytes` with `tag` (the peer receives with UcxEndpoint::receive or ucx_receive).
  void send(const void* data, size_t bytes, uint64_t tag, std::chrono::milliseconds timeout);
  // The same without waiting: `data` must stay valid until the request completed.
  UcxRequest send_async(const void* data, size_t bytes, uint64_t tag);

  ucp_ep_h handle() const { return ep_; }
  UcxContext& context() const { return context_; }
  const std::string& peer_name() const { return peer_name_; }

 private:
  void check_range(const char* op, const UcxRemoteKey& remote, size_t offset, size_t bytes) const;

  UcxContext& context_;
  std::string peer_name_;
  ucp_ep_h ep_ = nullptr;
  std::deque<void*> pending_;  // put_nowait requests, oldest first
};

// Receives one message with exactly `tag` from any peer into `data` (capacity `bytes`); returns
// the received length. Throws TimeoutError after `timeout`, TransportError when the message is
// longer than `bytes`.
size_t ucx_receive(UcxContext& context, void* data, size_t bytes, uint64_t tag, std::chrono::milliseconds timeout);
// The same without waiting: post the receive, wait on the request later.
UcxRequest ucx_receive_async(UcxContext& context, void* data, size_t bytes, uint64_t tag);

}  // namespace tessera::transport
