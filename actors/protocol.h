// The messages of tessera's actors, in one place so the protocol reads top to bottom.
//
// gradient-reducer   <- begin(staging)   a backward whose gradients must be reduced starts
//                                        (staging: its bucket inputs with partitioned gradients)
//                    <- ready(i)         parameter i's gradient is final for this backward
//                    <- flush            backward ended: issue every bucket not issued yet
//                    <- collect -> WorkList   the reductions issued since `begin` (flushes first)
// optimizer-shard    <- step(StepRequest) -> StepReport   wait reductions, clip, update, gather
// parameter-shard    <- gather -> GatherReport             all-gather the updated partitions
//
// Messages carry handles and small descriptors, never copies of buffers. Errors travel as
// std::exception_ptr inside the reply, so the user's thread rethrows the original tessera::Error
// (a TimeoutError stays a TimeoutError). All types are local to one process.
#pragma once

#include <caf/all.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <vector>

#include "actors/bucket_staging.h"
#include "core/optim/flat_optimizer.h"
#include "transport/communicator.h"

namespace tessera::actors {

using begin_atom = caf::atom_constant<caf::atom("begin")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using collect_atom = caf::atom_constant<caf::atom("collect")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using gather_atom = caf::atom_constant<caf::atom("gather")>;

struct WorkList {
  std::vector<std::shared_ptr<transport::Work>> works;  // in issue order
  // Per work, what must run after it completed (copy a reduction done in a lower-precision
  // staging buffer back into the gradients), or nullptr.
  std::vector<std::function<void()>> finish;
  std::exception_ptr error;                             // issuing failed

  // Waits for every work in order and runs its finisher (a null work was finished already).
  void wait_all() {
    for (size_t i = 0; i < works.size(); ++i) {
      if (!works[i]) continue;
      works[i]->wait();
      if (i < finish.size() && finish[i]) finish[i]();
    }
  }
};

struct StepRequest {
  std::vector<optim::StepHyperparameters> hyperparameters;  // per parameter group
  double max_grad_norm = 0.0;  // 0 = no clipping
  double loss_scale = 1.0;     // gradients are divided by it before anything else (fp16)
};

struct StepReport {
  double grad_norm = -1.0;  // global L2 norm of the averaged gradients (-1: not computed)
  bool overflow = false;    // fp16: a gradient was inf/NaN on some rank; nothing was updated
  double reduction_wait_s = 0;  // waiting for reductions still running when step() began
  double update_s = 0;          // unscale, clip and optimizer update
  double gather_s = 0;          // all-gather of the updated partitions
  std::exception_ptr error;
};

struct GatherReport {
  std::exception_ptr error;
};

}  // namespace tessera::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::shared_ptr<tessera::actors::BucketStaging>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::WorkList)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StepRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StepReport)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::GatherReport)
