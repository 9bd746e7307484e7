// The rollout-sink's messages (rollout_sink.cpp). The sink owns the weight sync's link: the UCX
// registration of the rollout's weights and the plans.
//
// rollout-sink
//   <- sync -> SyncReport        one sync (in place: the live weights; double-buffered: the standby)
//   <- listen                    receive syncs one after another (it sends itself `listen` again)
//                                until the sink's stop flag is set
//   <- stop -> Done              answered once no sync is under way (after the stop flag is set)
#pragma once

#include <caf/all.hpp>

#include <exception>

#include "actors/protocol.h"
#include "actors/rollout/weight_sync.h"

namespace tessera::actors {

using sync_atom = caf::atom_constant<caf::atom("sync")>;
using listen_atom = caf::atom_constant<caf::atom("listen")>;
using stop_atom = caf::atom_constant<caf::atom("stop")>;

struct SyncReport {
  WeightSyncStats stats;
  std::exception_ptr error;
};

using rollout_sink_actor = caf::typed_actor<caf::replies_to<sync_atom>::with<SyncReport>, caf::reacts_to<listen_atom>,
                                            caf::replies_to<stop_atom>::with<Done>>;

}  // namespace tessera::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::SyncReport)
