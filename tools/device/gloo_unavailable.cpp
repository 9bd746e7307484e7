// The device check builds the transport without Gloo (the GPU machine has no libgloo-dev): the
// factory every Communicator::gloo call reaches says so by name instead of failing to link.
#include "core/error.h"
#include "transport/detail/backend.h"

namespace tessera::transport {

std::unique_ptr<Backend> make_gloo_backend(std::shared_ptr<Store>, int, int, const CommunicatorOptions& options) {
  throw TransportError("communicator '" + options.name + "': Gloo is not part of the device check's build");
}

}  // namespace tessera::transport
