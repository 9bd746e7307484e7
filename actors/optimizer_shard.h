// The optimizer-shard actor: owns the optimizer states of this rank's partition of every flat
// group (stage 0: of the whole buffers; one FlatOptimizer per group, with its parameter group's
// settings) and performs one update per `step`: wait for the reductions the gradient reducer
// issued, clip by the global gradient norm, update the partition in place, then ask the
// parameter shard to all-gather. Runs on its own thread (it blocks on collectives).
//
// Clipping follows torch::nn::utils::clip_grad_norm_ (total = norm of the per-parameter norms,
// coefficient max_norm / (total + 1e-6) clamped at 1): exactly, on the full averaged gradients
// at stages 0/1; at stage 2 the per-parameter squared norms are summed across ranks first (the
// same value up to summation order).
#pragma once

#include <caf/fwd.hpp>

#include <memory>
#include <vector>

#include "core/optim/flat_optimizer.h"

namespace tessera::actors {

namespace detail {
struct EngineShared;
}

caf::actor spawn_optimizer_shard(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared,
                                 std::vector<std::shared_ptr<optim::FlatOptimizer>> optimizers, caf::actor reducer,
                                 caf::actor parameter_shard);

}  // namespace tessera::actors
