// The parameter-shard actor owns the flat parameter buffers of every flat group (the module's
// weights are views of them, zero::FlatParameters) and is the only issuer on the parameter
// communicator: after an update it all-gathers every rank's partition in place, group by group
// in plan order, so each rank's module holds the new weights (stages 1/2; stage 0 updates
// everything everywhere and gathers nothing). At ZeRO-3 it gathers and releases units
// on demand (spawn_stage3_parameter_shard). Runs on its own thread (a gather blocks until its collective completes).
//
// Lending: `partitions` lends this rank's partition views to the optimizer-shard for one update;
// the lend ends with `gather`. Between steps the module's forward reads the buffers on the user's
// thread while this actor does nothing.
#pragma once

#include <memory>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "core/zero/flat_parameters.h"
#include "core/zero/stage3_parameters.h"
#include "transport/communicator.h"

namespace tessera::actors {

// `flat[g]` is flat group g's buffer; `comm` the parameter communicator (nullptr with one rank).
parameter_shard_actor spawn_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::unique_ptr<zero::FlatParameters>> flat,
                                            std::shared_ptr<transport::Communicator> comm);

// ZeRO-3 (stage3_parameter_shard.cpp): owns the rank's partitions, the persistent copies and the
// units' storage. `fetch(u)` materialises unit u and all-gathers its segments (one collective per
// segment, issued together, in the order fetches arrive: the program's forward and backward
// order, the same on every rank); `release(u)` frees it; `gather` after an update all-gathers the
// persistent segments only (units are gathered on demand).
parameter_shard_actor spawn_stage3_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                                   std::unique_ptr<zero::Stage3Parameters> parameters,
                                                   std::shared_ptr<transport::Communicator> comm);

}  // namespace tessera::actors
