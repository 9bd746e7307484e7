// LaunchEnv is a process's place in its job as the launcher tells it through the environment
// (tessera-launch, or torchrun-compatible launchers): RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE and TESSERA_JOB. Unset variables mean a single process (rank 0 of 1).
//
// Example: the second process tessera-launch --nproc-per-node 2 starts sees RANK=1,
// WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2: from_env() gives {1, 2, 1, 2, "default"}.
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace tessera::transport {

// The integer in environment variable `name`, `fallback` when unset or empty; a value that is not
// an integer is an error naming the variable.
inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long value = std::strtol(v, &end, 10);
  if (errno != 0 || *end != '\0' || value < -2147483647L || value > 2147483647L)
    throw Error(std::string("environment variable ") + name + "='" + v + "' is not an integer");
  return static_cast<int>(value);
}

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string job = "default";

  static LaunchEnv from_env() {
    LaunchEnv e;
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    if (const char* job = std::getenv("TESSERA_JOB"); job && *job) e.job = job;
    if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
      throw Error("launcher environment: RANK=" + std::to_string(e.rank) + " is not in [0, WORLD_SIZE=" +
                  std::to_string(e.world_size) + ")");
    return e;
  }
};

}  // namespace tessera::transport
