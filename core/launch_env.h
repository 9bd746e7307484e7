// LaunchEnv is a process's place in its job as the launcher tells it through the environment
// (tessera-launch, or torchrun-compatible launchers), read in one place: RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, TESSERA_JOB, and where the job's store is (MASTER_ADDR,
// TESSERA_STORE_PORT, else MASTER_PORT, TESSERA_STORE_SECRET, TESSERA_STORE_SERVER). tessera-launch
// sets TESSERA_STORE_PORT and leaves MASTER_PORT (one above) to torch.distributed, whose env://
// store would otherwise take the same port; under another launcher the store is on MASTER_PORT. Unset variables mean a single process
// (rank 0 of 1) whose store it hosts itself on 127.0.0.1:29500. A value that does not parse is an
// error naming the variable. Reading the environment is all it does (it is in core so that every
// layer can ask; transport/launch_env.h names it for transport's users).
//
// Example: the second process tessera-launch --nproc-per-node 2 starts sees RANK=1,
// WORLD_SIZE=2, LOCAL_RANK=1, LOCAL_WORLD_SIZE=2: from_env() gives rank 1 of 2, local 1 of 2,
// job "default", and does not host the store (rank 0 does).
#pragma once

#include <cerrno>
#include <cstdlib>
#include <string>

#include "core/error.h"

namespace tessera {

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

// The string in environment variable `name`, `fallback` when unset or empty.
inline std::string env_string(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string job = "default";
  bool job_given = false;  // TESSERA_JOB was set (else a caller may use a default of its own)
  // The job's store.
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string store_secret;  // empty: none
  bool hosts_store = true;   // TESSERA_STORE_SERVER=1/0, else whether this is rank 0

  // TESSERA_CPU_LIST: the CPUs tessera-launch --bind-cores-to-rank bound this rank to ("" unbound).
  static std::string bound_cpu_list() { return env_string("TESSERA_CPU_LIST", ""); }

  static LaunchEnv from_env() {
    LaunchEnv e;
    e.rank = env_int("RANK", e.rank);
    e.world_size = env_int("WORLD_SIZE", e.world_size);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    e.job_given = !env_string("TESSERA_JOB", "").empty();
    e.job = env_string("TESSERA_JOB", e.job);
    if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size)
      throw Error("launcher environment: RANK=" + std::to_string(e.rank) + " is not in [0, WORLD_SIZE=" +
                  std::to_string(e.world_size) + ")");
    e.master_addr = env_string("MASTER_ADDR", e.master_addr);
    const char* port_variable = std::getenv("TESSERA_STORE_PORT") ? "TESSERA_STORE_PORT" : "MASTER_PORT";
    e.master_port = env_int(port_variable, e.master_port);
    if (e.master_port < 1 || e.master_port > 65535)
      throw Error(std::string("launcher environment: ") + port_variable + "=" + std::to_string(e.master_port) +
                  " is not a TCP port");
    e.store_secret = env_string("TESSERA_STORE_SECRET", "");
    const std::string server = env_string("TESSERA_STORE_SERVER", "");
    e.hosts_store = server.empty() ? e.rank == 0 : server == "1";
    return e;
  }
};

}  // namespace tessera
