// The gradient-reducer actor owns the gradients of this rank and is the only issuer on the
// gradient communicator: bucket reductions in the plan's fixed order while backward goes on, and
// at step time the clipping norm and the fp16 overflow flag (docs/DESIGN.md §7.2, §7.3: one issuer per
// communicator, program order).
//
// What it owns, per flat group:
//   stages 0/1: the flat gradient buffer (zero::FlatGradients; each .grad is a view, autograd
//     accumulates into it) - all-reduced (averaged) bucket by bucket, in place; with
//     torch_autocast a group reduced in bf16 goes through a bf16 mirror made once; with fp32
//     accumulation (bf16/fp16 models) an fp32 accumulator into which every backward is folded.
//   partitioned gradients (stage 2 across ranks): this rank's gradient partition; staged buckets
//     (bucket_staging.h) are reduced to their owner, which adds them into it at every backward
//     (DeepSpeed's stage 2: average per micro-step, then sum). These reduce as they fill whatever
//     overlap_comm says, since the staging ring is bounded.
//   mixed precision: an fp32 copy of the gradient partition, which the optimizer steps.
// Every buffer is allocated at spawn; a step allocates nothing big.
//
// Order: with overlap_comm (stages 0/1) bucket k is issued when all its parameters are ready and
// buckets 0..k-1 were issued; without it, all at `flush`. Issued work is not waited for in
// between: completed reductions are finished as messages arrive and by a 1 ms poll while any is
// outstanding. Runs on its own thread (finish, zero and reclaim wait for collectives).
//
// Clipping follows torch::nn::utils::clip_grad_norm_ (total = norm of the per-parameter norms,
// coefficient max_norm / (total + 1e-6) clamped at 1): LibTorch's own function on the full
// averaged gradients for fp32 at stages 0/1 (bitwise); otherwise the per-parameter squared
// norms of the partitions summed across ranks (the same value up to summation order).
#pragma once

#include <memory>
#include <vector>

#include "actors/bucket_staging.h"
#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "actors/unit_grad_staging.h"
#include "core/zero/flat_parameters.h"
#include "transport/communicator.h"

namespace tessera::actors {

// `parameters`: the module's trainable parameters in model order (their .grad is what autograd
// fills). `flat`: flat group g's parameters (stages 0/1 get their gradient buffers from them).
// `staging`: the bucket staging with partitioned gradients, else nullptr. `comm`: the gradient
// communicator (nullptr with one rank).
gradient_reducer_actor spawn_gradient_reducer(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters,
                                              const std::vector<std::unique_ptr<zero::FlatParameters>>& flat,
                                              std::shared_ptr<BucketStaging> staging,
                                              std::shared_ptr<UnitGradStaging> unit_staging,
                                              std::shared_ptr<transport::Communicator> comm);

}  // namespace tessera::actors
