// The process's place in a multi-process test: rank and size from tessera-launch's environment,
// the store (rank 0 hosts it on MASTER_PORT) and the world communicator, made once per process.
// Every rank runs the same Catch2 test cases in the same order, so collectives line up.
#pragma once

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

#include "transport/communicator.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace tessera::transport::testing {


struct MpWorld {
  int rank = env_int("RANK", 0);
  int size = env_int("WORLD_SIZE", 1);
  std::chrono::milliseconds timeout{env_int("TESSERA_TEST_TIMEOUT_MS", 60000)};
  std::shared_ptr<Store> store;
  std::shared_ptr<Communicator> world;

  static MpWorld& get() {
    static MpWorld w;
    return w;
  }

 private:
  MpWorld() {
    StoreOptions so;
    so.timeout = timeout;
    store = Store::from_env(so);
    CommunicatorOptions co;
    co.timeout = timeout;
    world = Communicator::gloo(store, rank, size, co);
  }
};

}  // namespace tessera::transport::testing
