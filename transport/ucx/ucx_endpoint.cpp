#include "transport/ucx/ucx_endpoint.h"

#include <ucp/api/ucp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "transport/ucx/ucx_context.h"

namespace tessera::transport {
namespace {

void noop_send(void*, ucs_status_t, void*) {}

void on_recv(void*, ucs_status_t, const ucp_tag_recv_info_t*, void*) {}

}  // namespace

UcxRequest::UcxRequest(UcxContext& context, void* request, std::string what, size_t bytes, bool is_receive)
    : context_(&context), request_(request), what_(std::move(what)), bytes_(bytes), is_receive_(is_receive) {
  if (UCS_PTR_IS_ERR(request_)) {
    auto status = UCS_PTR_STATUS(request_);
    request_ = nullptr;
    throw TransportError("UCX " + what_ + " failed: " + ucs_status_string(status));
  }
}

UcxRequest::UcxRequest(UcxRequest&& other) noexcept
    : context_(other.context_), request_(other.request_), what_(std::move(other.what_)), bytes_(other.bytes_),
      is_receive_(other.is_receive_) {
  other.request_ = nullptr;
}

UcxRequest::~UcxRequest() {
  if (!request_) return;
  try {
    context_->wait(request_, std::chrono::milliseconds(1), what_);  // cancels when still pending
  } catch (const std::exception&) {
  }
}

size_t UcxRequest::wait(std::chrono::milliseconds timeout) {
  void* request = request_;
  request_ = nullptr;
  if (!request) return bytes_;  // completed in place (or waited already)
  size_t received = bytes_;
  context_->wait(request, timeout, what_, is_receive_ ? &received : nullptr);
  return received;
}

UcxRemoteKey::UcxRemoteKey(UcxEndpoint& endpoint, const std::vector<uint8_t>& descriptor) {
  if (descriptor.size() < 16)
    throw TransportError("UCX remote key of " + endpoint.peer_name() + ": descriptor of " +
                         std::to_string(descriptor.size()) + " bytes is too short");
  std::memcpy(&base_, descriptor.data(), 8);
  uint64_t length = 0;
  std::memcpy(&length, descriptor.data() + 8, 8);
  bytes_ = length;
  if (descriptor.size() == 16) return;  // an empty buffer
  ucs_status_t status = ucp_ep_rkey_unpack(endpoint.handle(), descriptor.data() + 16, &rkey_);
  if (status != UCS_OK)
    throw TransportError("UCX ucp_ep_rkey_unpack for " + endpoint.peer_name() + " failed: " + ucs_status_string(status));
}

void* UcxRemoteKey::mapped(size_t offset) const {
  if (!rkey_ || offset >= bytes_) return nullptr;
  void* local = nullptr;
  return ucp_rkey_ptr(rkey_, base_ + offset, &local) == UCS_OK ? local : nullptr;
}

UcxRemoteKey::~UcxRemoteKey() {
  if (rkey_) ucp_rkey_destroy(rkey_);
}

UcxEndpoint::UcxEndpoint(UcxContext& context, const std::vector<uint8_t>& peer_address, std::string peer_name)
    : context_(context), peer_name_(std::move(peer_name)) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
  params.address = reinterpret_cast<const ucp_address_t*>(peer_address.data());
  ucs_status_t status = ucp_ep_create(context_.worker(), &params, &ep_);
  if (status != UCS_OK)
    throw TransportError("UCX ucp_ep_create to " + peer_name_ + " failed: " + ucs_status_string(status));
}

UcxEndpoint::~UcxEndpoint() {
  if (!ep_) return;
  for (void* request : pending_) {
    try {
      context_.wait(request, std::chrono::seconds(5), "put to " + peer_name_);
    } catch (const std::exception&) {
    }
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = UCP_EP_CLOSE_FLAG_FORCE;
  void* request = ucp_ep_close_nbx(ep_, &param);
  try {
    context_.wait(request, std::chrono::seconds(5), "endpoint close");
  } catch (const std::exception&) {
    // Closing never throws: the peer may be gone already.
  }
}

void UcxEndpoint::check_range(const char* op, const UcxRemoteKey& remote, size_t offset, size_t bytes) const {
  if (offset > remote.bytes() || bytes > remote.bytes() - offset)
    throw TransportError(std::string("UCX ") + op + " to " + peer_name_ + ": bytes [" + std::to_string(offset) + ", " +
                         std::to_string(offset + bytes) + ") outside the registered " +
                         std::to_string(remote.bytes()) + " bytes");
}

void UcxEndpoint::put(const void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset,
                      std::chrono::milliseconds timeout) {
  check_range("put", remote, offset, bytes);
  if (bytes == 0) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  void* request = ucp_put_nbx(ep_, local, bytes, remote.base() + offset, remote.handle(), &param);
  context_.wait(request, timeout, "put of " + std::to_string(bytes) + " bytes to " + peer_name_);
}

bool UcxEndpoint::put_nowait(const void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset,
                             std::chrono::milliseconds timeout) {
  check_range("put", remote, offset, bytes);
  if (bytes == 0) return true;
  if (pending_.size() >= kMaxPending) {
    // Fast path: progress until the oldest put is done; the named, bounded wait only when slow.
    void* oldest = pending_.front();
    pending_.pop_front();
    for (int spin = 0; spin < 4096 && ucp_request_check_status(oldest) == UCS_INPROGRESS; ++spin)
      ucp_worker_progress(context_.worker());
    if (ucp_request_check_status(oldest) == UCS_OK) {
      ucp_request_free(oldest);
    } else {
      context_.wait(oldest, timeout, "put to " + peer_name_);
    }
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  void* request = ucp_put_nbx(ep_, local, bytes, remote.base() + offset, remote.handle(), &param);
  if (UCS_PTR_IS_ERR(request))
    throw TransportError("UCX put of " + std::to_string(bytes) + " bytes to " + peer_name_ +
                         " failed: " + ucs_status_string(UCS_PTR_STATUS(request)));
  if (!request) return true;  // completed in place
  pending_.push_back(request);
  return false;
}

void UcxEndpoint::get(void* local, size_t bytes, const UcxRemoteKey& remote, size_t offset,
                      std::chrono::milliseconds timeout) {
  check_range("get", remote, offset, bytes);
  if (bytes == 0) return;
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  void* request = ucp_get_nbx(ep_, local, bytes, remote.base() + offset, remote.handle(), &param);
  context_.wait(request, timeout, "get of " + std::to_string(bytes) + " bytes from " + peer_name_);
}

void UcxEndpoint::flush(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!pending_.empty()) {
    void* request = pending_.front();
    pending_.pop_front();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    context_.wait(request, std::max(left, std::chrono::milliseconds(1)), "put to " + peer_name_);
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  context_.wait(ucp_ep_flush_nbx(ep_, &param), timeout, "flush to " + peer_name_);
}

void UcxEndpoint::send(const void* data, size_t bytes, uint64_t tag, std::chrono::milliseconds timeout) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  void* request = ucp_tag_send_nbx(ep_, data, bytes, tag, &param);
  context_.wait(request, timeout, "tagged send of " + std::to_string(bytes) + " bytes to " + peer_name_);
}

UcxRequest UcxEndpoint::send_async(const void* data, size_t bytes, uint64_t tag) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
  param.cb.send = noop_send;
  return UcxRequest(context_, ucp_tag_send_nbx(ep_, data, bytes, tag, &param),
                    "tagged send of " + std::to_string(bytes) + " bytes to " + peer_name_, bytes, false);
}

UcxRequest ucx_receive_async(UcxContext& context, void* data, size_t bytes, uint64_t tag) {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = on_recv;
  return UcxRequest(context, ucp_tag_recv_nbx(context.worker(), data, bytes, tag, ~uint64_t{0}, &param),
                    "tagged receive of tag " + std::to_string(tag) + " (" + std::to_string(bytes) + " bytes)", bytes,
                    true);
}

size_t ucx_receive(UcxContext& context, void* data, size_t bytes, uint64_t tag, std::chrono::milliseconds timeout) {
  ucp_request_param_t param{};
  // Always a request (never completion in place), so its length can be read from it.
  param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = on_recv;
  void* request = ucp_tag_recv_nbx(context.worker(), data, bytes, tag, ~uint64_t{0}, &param);
  size_t received = 0;
  context.wait(request, timeout, "tagged receive of tag " + std::to_string(tag) + " (" + std::to_string(bytes) +
               " bytes)", &received);
  return received;
}

}  // namespace tessera::transport
