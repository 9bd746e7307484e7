// The parameter-shard actor owns the flat parameter buffers of every flat group (the module's
// weights are views of them, zero::FlatParameters) and is the only issuer on the parameter
// communicator: after an update it all-gathers every rank's partition in place, group by group
// in plan order, so each rank's module holds the new weights (stages 1/2; stage 0 updates
// everything everywhere and gathers nothing). ZeRO-3 will gather, release and prefetch units
// here. Runs on its own thread (a gather blocks until its collective completes).
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
#include "transport/communicator.h"

namespace tessera::actors {

// `flat[g]` is flat group g's buffer; `comm` the parameter communicator (nullptr with one rank).
parameter_shard_actor spawn_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::unique_ptr<zero::FlatParameters>> flat,
                                            std::shared_ptr<transport::Communicator> comm);

}  // namespace tessera::actors
