// The process's one CAF actor system and, for engines started by tessera-launch, the job's one
// rendezvous store: both are per process, shared by every engine in it.
#pragma once

#include <caf/fwd.hpp>

#include <memory>
#include <string>

namespace tessera::transport {
class Store;
}

namespace tessera::actors {

// Created on first use, never destroyed: CAF's destructor waits for every actor, and an engine a
// user leaks at exit must not hang the process.
caf::actor_system& actor_system();

// The store named by the launcher's environment (MASTER_ADDR, MASTER_PORT, TESSERA_JOB), created
// on first use (rank 0 hosts it).
std::shared_ptr<transport::Store> job_store();

// A name no other communicator of this process has used ("engine0", "engine1", ...); every rank
// creates engines in the same order, so the names agree.
std::string next_communicator_name(const std::string& prefix);

}  // namespace tessera::actors
