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

// Another client connection to the same store (job_store() is made first, so the server exists).
// A store connection serves one request at a time and a blocking wait holds it: an actor that
// talks to the store while the user's thread may sit in a wait (the rollout-sink) takes its own.
std::shared_ptr<transport::Store> own_job_store_connection();

// A name no other communicator of this process has used ("engine0", "engine1", ...); every rank
// creates engines in the same order, so the names agree.
std::string next_communicator_name(const std::string& prefix);

}  // namespace tessera::actors
