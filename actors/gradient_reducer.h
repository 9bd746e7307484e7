// The gradient-reducer actor: turns "gradient ready" events from autograd into bucketed
// reductions issued in the plan's fixed order while backward goes on.
//
// Stages 0/1 all-reduce (average) each bucket of a flat gradient buffer in place. A bucket of a
// flat group whose comm dtype is lower than its gradients' (autocast's lower_precision_safe_
// modules) is reduced in a copy of that dtype, copied back when the work completes
// (WorkList::finish).
// Stage 2 across ranks (partitioned gradients) has no flat gradient buffer: `begin` brings the
// backward's BucketStaging, into which autograd's thread has copied each ready .grad, and each
// bucket's reduce-scatter output is added into this rank's reduced partition.
// With overlap_comm, bucket k is issued when all its parameters are ready and buckets 0..k-1 were
// issued (without it, all buckets are issued in order when backward ends), so every
// rank issues the same collectives in the same order whatever order autograd reports in.
// Issued work is not waited for here: completed works are finished as messages arrive, and
// `collect` hands the rest to whoever waits (the optimizer shard, zero_grad), so this actor never
// blocks.
#pragma once

#include <caf/fwd.hpp>

#include <memory>

namespace tessera::actors {

namespace detail {
struct EngineShared;
}

caf::actor spawn_gradient_reducer(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared);

}  // namespace tessera::actors
