// Access to the c10d store behind a tessera Store, for transport internals only (Gloo process
// groups, the gloo library's rendezvous). Includes c10d headers: never include from a public header.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <string>

#include "transport/store.h"

namespace tessera::transport {

namespace rendezvous {
class StoreServer;
}

struct Store::Impl {
  std::shared_ptr<rendezvous::StoreServer> server;  // when this process hosts the TCP store
  c10::intrusive_ptr<c10d::Store> store;
  std::string where;
};

// A c10d store whose keys all get `store.prefix()` + sub_prefix in front.
c10::intrusive_ptr<c10d::Store> c10d_store(const Store& store, const std::string& sub_prefix = "");

}  // namespace tessera::transport
