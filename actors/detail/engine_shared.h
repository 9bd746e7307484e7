// What the actors of one engine share by handle: the flat groups (each actor touches only the
// part it owns at a given moment, in the order the protocol fixes), the bucket plan and the
// data-parallel communicator. Built once by the engine, immutable afterwards.
//
// A flat group is one parameter group's parameters whose gradients are reduced in one dtype
// (DeepSpeed's bit16 groups): with torch_autocast, a parameter group splits into the parameters
// of lower_precision_safe_modules (reduced in the autocast dtype) and the rest.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/zero/bucket_plan.h"
#include "core/zero/flat_parameters.h"
#include "transport/communicator.h"

namespace tessera::actors::detail {

struct FlatGroup {
  std::unique_ptr<zero::FlatParameters> flat;  // laid out for `world` (stage >= 1) or 1 (stage 0)
  std::vector<int64_t> params;                 // model-wide indices of its parameters, ascending
  int64_t param_group = 0;                     // the user's parameter group it belongs to
  at::ScalarType comm_dtype = at::kFloat;      // gradients are reduced in this dtype
  at::Tensor master;                           // fp32 master partition (mixed precision), else undefined
  // fp32 gradient accumulator laid out like the flat buffers (data_types.grad_accum_dtype = fp32
  // with bf16/fp16), else undefined. The low-precision gradients of each backward are folded
  // into it (and zeroed); it is what gets reduced and stepped.
  at::Tensor accum;
  // ZeRO-2 with partitioned gradients: this rank's reduced gradient partition [partition_numel],
  // in the accumulation dtype; each reduction adds into it. Else undefined.
  at::Tensor reduced;

  // Adds the flat gradient range [begin, begin + length) into `accum` and zeroes it.
  void fold(int64_t begin, int64_t length) const {
    auto g = flat->grad_buffer().narrow(0, begin, length);
    accum.narrow(0, begin, length).add_(g);
    g.zero_();
  }
  // What gets reduced (flat-gradient modes): the accumulator, or the flat gradients.
  const at::Tensor& gradients() const { return accum.defined() ? accum : flat->grad_buffer(); }
  // What gets stepped: rank `rank`'s partition of the reduced gradients.
  at::Tensor gradient_partition(int64_t rank) const {
    if (reduced.defined()) return reduced;
    const auto& l = flat->layout();
    return gradients().narrow(0, l.partition_begin(rank), l.partition_numel);
  }
};

struct EngineShared {
  int64_t stage = 0;
  at::ScalarType dtype = at::kFloat;  // of the parameters and gradients (fp32, bf16 or fp16)
  bool fp16 = false;                  // check overflow and skip such steps
  bool fp32_master = false;           // keep fp32 master weights of the partition (bf16/fp16)
  bool overlap_comm = false;          // reduce buckets as they fill during backward, else at its end
  // ZeRO-2 across ranks: no flat gradient buffer. Each ready .grad is copied into the staging of
  // its buckets and released (BucketStaging), and the reducer reduce-scatters into
  // FlatGroup::reduced, at every backward (DeepSpeed's stage 2).
  bool partitioned_gradients = false;
  int rank = 0;        // in the data-parallel group
  int world = 1;       // data-parallel size
  std::shared_ptr<transport::Communicator> dp;  // nullptr when world == 1
  std::vector<FlatGroup> groups;
  std::vector<std::string> names;               // dotted parameter names, model order
  std::vector<std::vector<int64_t>> shapes;     // parameter shapes, model order
  std::vector<at::Tensor> parameters;           // the module's trainable parameters, model order
  int64_t alignment = 1;                        // partition alignment (elements) of every group
  zero::BucketPlan plan;                        // over all groups, model-wide parameter indices
  std::chrono::milliseconds timeout{300000};

  int64_t owned_rank() const { return stage >= 1 ? rank : 0; }  // the partition this rank updates
};

}  // namespace tessera::actors::detail
