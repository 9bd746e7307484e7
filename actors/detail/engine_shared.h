// What the actors of one engine share by handle: the flat buffers (each actor touches only the
// part it owns at a given moment, in the order the protocol fixes), the bucket plan and the
// data-parallel communicator. Built once by the engine, immutable afterwards.
#pragma once

#include <chrono>
#include <memory>

#include "core/zero/bucket_plan.h"
#include "core/zero/flat_parameters.h"
#include "transport/communicator.h"

namespace tessera::actors::detail {

struct EngineShared {
  int64_t stage = 0;
  at::ScalarType dtype = at::kFloat;  // of the parameters and gradients (fp32, bf16 or fp16)
  bool fp16 = false;                  // check overflow and skip such steps
  bool fp32_master = false;           // keep fp32 master weights of the partition (bf16/fp16)
  bool overlap_comm = false;          // reduce buckets as they fill during backward, else at its end
  int rank = 0;        // in the data-parallel group
  int world = 1;       // data-parallel size
  std::shared_ptr<transport::Communicator> dp;  // nullptr when world == 1
  std::unique_ptr<zero::FlatParameters> flat;   // laid out for `world` (stage >= 1) or 1 (stage 0)
  std::vector<std::string> names;               // dotted parameter names, flat order
  std::vector<std::vector<int64_t>> shapes;     // parameter shapes, flat order
  int64_t alignment = 1;                        // partition alignment (elements) of `flat`
  at::Tensor master;                            // fp32 master partition (mixed precision), else undefined
  zero::BucketPlan plan;
  std::chrono::milliseconds timeout{300000};
};

}  // namespace tessera::actors::detail
