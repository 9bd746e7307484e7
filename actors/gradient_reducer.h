// The gradient-reducer actor: turns "gradient ready" events from autograd into bucketed
// reductions issued in the plan's fixed order while backward goes on.
//
// Stages 0/1 all-reduce (average) each bucket of a flat gradient buffer in place; stage 2
// reduce-scatters (average) partition-aligned buckets so each rank receives its own partition.
// A bucket of a flat group whose comm dtype is lower than its gradients' (autocast's
// lower_precision_safe_modules) is reduced in a staging copy of that dtype and copied back
// when the work completes (WorkList::finish).
// With partitioned gradients (stage 2 across ranks) there is no flat gradient buffer: when a
// parameter is ready its .grad is copied into the packed inputs of its buckets and released, and
// each bucket's reduce-scatter output is added into this rank's reduced partition; parameters
// not reported by `flush` contribute their accumulated .grad (no_sync, coalesced reductions).
// With overlap_comm, bucket k is issued when all its parameters are ready and buckets 0..k-1 were
// issued (without it, all buckets are issued in order when backward ends), so every
// rank issues the same collectives in the same order whatever order autograd reports in.
// Issued work is not waited for here: `collect` hands the handles to whoever waits (the
// optimizer shard, or the end of a backward with partitioned gradients), so this actor never
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
