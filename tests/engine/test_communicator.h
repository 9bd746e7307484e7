// What engine tests use beside the engine: their own Gloo communicator over the job's store, one
// per name per process, for barriers and gathers (the engine's communicators are its own), and
// string settings from the environment.
#pragma once

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>

#include "actors/actor_runtime.h"
#include "tests/engine/engine_test_support.h"
#include "transport/communicator.h"

namespace tessera::engine_testing {

inline transport::Communicator& test_communicator(const std::string& name,
                                                  std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
  static std::map<std::string, std::shared_ptr<transport::Communicator>> made;
  auto& comm = made[name];
  if (!comm) {
    transport::CommunicatorOptions o;
    o.name = name;
    o.timeout = timeout;
    comm = transport::Communicator::gloo(actors::job_store(), kRank, kWorld, o);
  }
  return *comm;
}

// The variable's value, or `fallback` when it is unset or empty.
inline std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

}  // namespace tessera::engine_testing
