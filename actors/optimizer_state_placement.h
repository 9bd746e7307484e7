// Where the optimizer-shard keeps each sub-group's master and optimizer states: beside the
// parameters (optim::MemoryStateStore), all in host memory (the same store, host tensors), in an
// NVMe swap file (optim::NvmeStateStore), or split by offload_optimizer.ratio between the host
// and the device (optim::SplitStateStore). Built once, before the first update.
//
// Example: 4 sub-groups, ratio 0.5: host_sub_groups() is 2, and the store keeps sub-groups
// 0-1 in host memory and 2-3 beside the parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <utility>
#include <vector>

#include "actors/engine_spec.h"
#include "core/optim/nvme_state_store.h"
#include "core/optim/optimizer_kernel.h"
#include "core/optim/split_state_store.h"

namespace tessera::actors {

using SubGroupRanges = std::vector<std::vector<std::pair<int64_t, int64_t>>>;  // per flat group, [begin, end)

// How many of the rank's sub-groups (in update order) step on the host: all with offload at
// ratio 1, floor(ratio x count) below (DeepSpeed's rule; a warning where that is none or all), none
// without offload. A ratio below 1 with whole-partition kernels (client optimizers) is refused by name.
int64_t host_sub_groups(const EngineSpec& spec, const std::vector<std::shared_ptr<optim::OptimizerKernel>>& kernels,
                        const SubGroupRanges& sub_groups);

struct PlacedStates {
  std::unique_ptr<optim::StateStore> store;
  optim::NvmeStateStore* nvme = nullptr;    // the store, when it is the NVMe one
  optim::SplitStateStore* split = nullptr;  // the store, when only part of it is on the host
};

// `partitions[g]` gives the initial masters and the states' shapes; `host_count` comes from
// host_sub_groups(); `staging_slots` (the offload actor's) sizes the NVMe store's buffers.
PlacedStates place_optimizer_states(const EngineSpec& spec, const std::vector<std::shared_ptr<optim::OptimizerKernel>>& kernels,
                                    const std::vector<at::Tensor>& partitions, const SubGroupRanges& sub_groups,
                                    int64_t host_count, int64_t staging_slots);

}  // namespace tessera::actors
