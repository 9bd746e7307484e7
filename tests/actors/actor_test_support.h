// What the actor protocol tests share: this process's rank and world from tessera-launch's
// environment, their timeout, and a Gloo communicator of every rank (nullptr on one rank).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "actors/actor_runtime.h"
#include "core/launch_env.h"
#include "transport/communicator.h"

namespace tessera::actors::testing {

inline const int kRank = LaunchEnv::from_env().rank;
inline const int kWorld = LaunchEnv::from_env().world_size;
inline const std::chrono::milliseconds kTimeout{30000};

inline std::shared_ptr<transport::Communicator> comm(const std::string& name) {
  if (kWorld == 1) return nullptr;
  transport::CommunicatorOptions o;
  o.name = name;
  o.timeout = kTimeout;
  auto c = transport::Communicator::gloo(job_store(), kRank, kWorld, o);
  c->barrier()->wait();
  return c;
}

}  // namespace tessera::actors::testing
