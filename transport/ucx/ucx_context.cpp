#include "transport/ucx/ucx_context.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include <ucp/api/ucp.h>
#include <uct/api/uct.h>

#include "core/error.h"

namespace tessera::transport {
namespace {

// The longest sleep between polls of an idle wait: the latency it may add to a completion.
constexpr int kMaxIdleNapMicroseconds = 500;

[[noreturn]] void throw_ucs(const char* operation, ucs_status_t status) {
  throw TransportError(std::string("UCX ") + operation + " failed: " + ucs_status_string(status));
}

}  // namespace

UcxContext::UcxContext(const UcxContextOptions& options) {
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
  if (status != UCS_OK) throw_ucs("ucp_config_read", status);
  if (!options.transports.empty()) {
    status = ucp_config_modify(config, "TLS", options.transports.c_str());
    if (status != UCS_OK) {
      ucp_config_release(config);
      throw TransportError("UCX transports '" + options.transports +
                           "' rejected (tessera.transport.ucx_tls): " + ucs_status_string(status));
    }
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = (options.enable_tag ? UCP_FEATURE_TAG : 0) | (options.enable_rma ? UCP_FEATURE_RMA : 0);
  status = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (status != UCS_OK) throw_ucs("ucp_init", status);

  ucp_worker_params_t worker_params{};
  worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  worker_params.thread_mode = UCS_THREAD_MODE_SINGLE;
  status = ucp_worker_create(context_, &worker_params, &worker_);
  if (status != UCS_OK) {
    ucp_cleanup(context_);
    throw_ucs("ucp_worker_create", status);
  }
}

std::vector<uint8_t> UcxContext::worker_address() const {
  ucp_address_t* address = nullptr;
  size_t length = 0;
  ucs_status_t status = ucp_worker_get_address(worker_, &address, &length);
  if (status != UCS_OK) throw_ucs("ucp_worker_get_address", status);
  std::vector<uint8_t> bytes(reinterpret_cast<uint8_t*>(address), reinterpret_cast<uint8_t*>(address) + length);
  ucp_worker_release_address(worker_, address);
  return bytes;
}

bool UcxContext::progress() { return ucp_worker_progress(worker_) != 0; }

void UcxContext::wait(void* request, std::chrono::milliseconds timeout, const std::string& what,
                      size_t* received_bytes) {
  if (request == nullptr) return;  // completed in place
  if (UCS_PTR_IS_ERR(request))
    throw TransportError("UCX " + what + " failed: " + ucs_status_string(UCS_PTR_STATUS(request)));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ucp_tag_recv_info_t info{};
  auto check = [&] {
    return received_bytes ? ucp_tag_recv_request_test(request, &info) : ucp_request_check_status(request);
  };
  ucs_status_t status;
  // Spin while the worker makes progress; once it has been idle a while, sleep between polls,
  // longer the longer it stays idle (20 us doubling up to 0.5 ms), so a rank waiting for others (a
  // rollout rank waiting for a sync's "done") does not take the cores its peers are copying on
  // (ranks of both jobs often share a machine's cores): four rollout ranks polling every 20 us
  // took 40% of two cores' samples during a 2 -> 4 sync (bench/sync, perf). Any progress resets
  // it, so emulated puts the target must progress still run at spinning speed.
  int idle = 0;
  auto nap = std::chrono::microseconds(20);
  while ((status = check()) == UCS_INPROGRESS) {
    const bool progressed = ucp_worker_progress(worker_) != 0;
    idle = progressed ? 0 : idle + 1;
    if (idle == 0) nap = std::chrono::microseconds(20);
    if (idle > 256) {
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(kMaxIdleNapMicroseconds));
    }
    if (!progressed && std::chrono::steady_clock::now() > deadline) {
      ucp_request_cancel(worker_, request);
      // The cancelled request completes (with UCS_ERR_CANCELED) on a later progress call.
      for (int i = 0; i < 100000 && ucp_request_check_status(request) == UCS_INPROGRESS; ++i)
        ucp_worker_progress(worker_);
      ucp_request_free(request);
      throw TimeoutError("UCX " + what + " did not complete within " + std::to_string(timeout.count()) +
                         " ms (is the peer alive and progressing its worker?)");
    }
  }
  ucp_request_free(request);
  if (status != UCS_OK) throw TransportError("UCX " + what + " failed: " + ucs_status_string(status));
  if (received_bytes) *received_bytes = info.length;
}

UcxContext::~UcxContext() {
  if (worker_) ucp_worker_destroy(worker_);
  if (context_) ucp_cleanup(context_);
}

std::string ucx_version() {
  unsigned major = 0, minor = 0, release = 0;
  ucp_get_version(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

std::vector<std::string> ucx_transports() {
  std::vector<std::string> names;
  uct_component_h* components = nullptr;
  unsigned num_components = 0;
  ucs_status_t status = uct_query_components(&components, &num_components);
  if (status != UCS_OK) throw_ucs("uct_query_components", status);
  for (unsigned c = 0; c < num_components; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const auto& md_desc : mds) {
      uct_md_config_t* md_config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &md_config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      status = uct_md_open(components[c], md_desc.md_name, md_config, &md);
      uct_config_release(md_config);
      if (status != UCS_OK) continue;
      uct_tl_resource_desc_t* resources = nullptr;
      unsigned num_resources = 0;
      if (uct_md_query_tl_resources(md, &resources, &num_resources) == UCS_OK) {
        for (unsigned r = 0; r < num_resources; ++r)
          names.push_back(std::string(resources[r].tl_name) + "/" + resources[r].dev_name);
        uct_release_tl_resource_list(resources);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return names;
}

}  // namespace tessera::transport
