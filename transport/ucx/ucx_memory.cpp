#include "transport/ucx/ucx_memory.h"

#include <ucp/api/ucp.h>

#include <cstring>
#include <string>

#include "core/error.h"
#include "transport/ucx/ucx_context.h"

namespace tessera::transport {

UcxMemory::UcxMemory(UcxContext& context, void* address, size_t bytes)
    : context_(context), address_(address), bytes_(bytes) {
  if (bytes == 0) return;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  params.address = address;
  params.length = bytes;
  ucs_status_t status = ucp_mem_map(context_.context(), &params, &memh_);
  if (status != UCS_OK)
    throw TransportError("UCX ucp_mem_map of " + std::to_string(bytes) + " bytes failed: " + ucs_status_string(status));
}

UcxMemory::UcxMemory(UcxContext& context, size_t bytes, Allocated) : context_(context), address_(nullptr), bytes_(bytes) {
  if (bytes == 0) return;
  ucp_mem_map_params_t params{};
  params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  params.address = nullptr;
  params.length = bytes;
  params.flags = UCP_MEM_MAP_ALLOCATE;
  ucs_status_t status = ucp_mem_map(context_.context(), &params, &memh_);
  if (status != UCS_OK)
    throw TransportError("UCX ucp_mem_map (allocate) of " + std::to_string(bytes) + " bytes failed: " +
                         ucs_status_string(status));
  ucp_mem_attr_t attr{};
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  status = ucp_mem_query(memh_, &attr);
  if (status != UCS_OK) {
    ucp_mem_unmap(context_.context(), memh_);
    throw TransportError(std::string("UCX ucp_mem_query failed: ") + ucs_status_string(status));
  }
  address_ = attr.address;
}

std::unique_ptr<UcxMemory> UcxMemory::allocate(UcxContext& context, size_t bytes) {
  return std::unique_ptr<UcxMemory>(new UcxMemory(context, bytes, Allocated{}));
}

UcxMemory::~UcxMemory() {
  if (memh_) ucp_mem_unmap(context_.context(), memh_);
}

std::vector<uint8_t> UcxMemory::descriptor() const {
  std::vector<uint8_t> out(16);
  uint64_t base = reinterpret_cast<uintptr_t>(address_), length = bytes_;
  std::memcpy(out.data(), &base, 8);
  std::memcpy(out.data() + 8, &length, 8);
  if (memh_) {
    void* packed = nullptr;
    size_t size = 0;
    ucs_status_t status = ucp_rkey_pack(context_.context(), memh_, &packed, &size);
    if (status != UCS_OK) throw TransportError(std::string("UCX ucp_rkey_pack failed: ") + ucs_status_string(status));
    out.insert(out.end(), static_cast<uint8_t*>(packed), static_cast<uint8_t*>(packed) + size);
    ucp_rkey_buffer_release(packed);
  }
  return out;
}

}  // namespace tessera::transport
