// The optimizer-shard actor owns the optimizer side of this rank's partitions: fp32 masters and
// optimizer states in a state store (beside the parameters, in host memory, in an NVMe swap file
// or split between host and device: optimizer_state_placement.h), stateless optimizer kernels (one per flat group, with its
// parameter group's settings) and their workspace. It performs one update per `step`:
//   finish -> the gradient-reducer (waits, unscales, checks overflow, clips; lends partitions)
//   partitions -> the parameter-shard (lends this rank's parameter partitions)
//   update every flat group sub-group by sub-group (master, then rounded into the parameters)
//   gather -> the parameter-shard and zero -> the gradient-reducer, concurrently (the lends end)
// A skipped update (fp16 overflow) only zeroes. It issues no collective itself. Runs on its own
// thread: it waits for the other two.
#pragma once

#include <memory>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "core/optim/optimizer_kernel.h"

namespace tessera::actors {

// `kernels[g]`: flat group g's kernel. `partitions[g]`: this rank's partition of flat group g's
// parameters, read once here (before any update) for the initial fp32 masters and the states'
// shapes; updates go through the parameter-shard's `partitions` lend.
optimizer_shard_actor spawn_optimizer_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels,
                                            const std::vector<at::Tensor>& partitions, gradient_reducer_actor reducer,
                                            parameter_shard_actor parameter_shard);

}  // namespace tessera::actors
