#include "actors/optimizer_state_placement.h"

#include <ATen/ATen.h>

#include <cmath>
#include <string>

#include "core/error.h"
#include "core/log/log.h"

namespace tessera::actors {
namespace {

// Optimizer offload to NVMe: one swap file per rank under nvme_path, filled sub-group by
// sub-group with the initial master (the partition in the host master's dtype) and states, so that
// no whole partition of states is ever in host memory. `groups` holds the dtypes and sub-groups.
std::unique_ptr<optim::StateStore> nvme_store(const EngineSpec& spec,
                                              const std::vector<std::shared_ptr<optim::OptimizerKernel>>& kernels,
                                              const std::vector<at::Tensor>& partitions,
                                              const std::vector<optim::MemoryStateStore::Group>& groups,
                                              int64_t staging_slots, optim::NvmeStateStore*& out) {
  std::vector<optim::NvmeStateStore::Group> layout;
  for (const auto& g : groups) {
    optim::NvmeStateStore::Group l;
    l.master_dtype = g.master.scalar_type();
    for (const auto& t : g.states) l.state_dtypes.push_back(t.scalar_type());
    l.sub_groups = g.sub_groups;
    layout.push_back(std::move(l));
  }
  auto fill = [&](int64_t g, int64_t sub) {
    const auto [begin, end] = groups[size_t(g)].sub_groups[size_t(sub)];
    optim::SubGroupState state;
    state.master = partitions[size_t(g)].narrow(0, begin, end - begin).to(
        at::TensorOptions().device(at::kCPU).dtype(groups[size_t(g)].master.scalar_type()), false, /*copy=*/true);
    state.states = kernels[size_t(g)]->initial_states(state.master);
    return state;
  };
  optim::NvmeStoreOptions options;
  options.path = spec.optimizer_offload.nvme_path + "/tessera_optimizer_rank" + std::to_string(spec.rank) + ".swap";
  // The one stepping, the one whose weights are leaving, one read ahead and one written behind.
  options.buffers = std::max<int64_t>(std::max<int64_t>(3, spec.optimizer_offload.buffer_count), staging_slots > 1 ? 4 : 3);
  options.aio = spec.optimizer_offload.aio;
  auto store = std::make_unique<optim::NvmeStateStore>(std::move(layout), fill, options);
  out = store.get();
  return store;
}

// Partial optimizer offload (ratio < 1): per flat group, the master and states of its host
// sub-groups (the first `on_host`) in host memory, the rest's beside the parameters. A group split
// between both keeps a device master even without fp32 masters, so that its whole partition has one
// kind of master (checkpoints, storage maps); it equals the weights then, bit for bit.
optim::SplitStateStore::Group split_group(const EngineSpec& spec, const optim::OptimizerKernel& kernel,
                                          const at::Tensor& partition, std::vector<std::pair<int64_t, int64_t>> sub_groups,
                                          int64_t on_host) {
  optim::SplitStateStore::Group group;
  const int64_t split = on_host == 0 ? 0 : sub_groups[size_t(on_host - 1)].second;
  const int64_t rest = partition.numel() - split;
  if (on_host > 0) {
    group.host.master = partition.narrow(0, 0, split).to(
        at::TensorOptions().device(at::kCPU).dtype(spec.master_dtype()), false, /*copy=*/true);
    group.host.states = kernel.initial_states(group.host.master);
  }
  if (on_host < int64_t(sub_groups.size())) {
    const auto device_part = partition.narrow(0, split, rest);
    if (spec.fp32_master || on_host > 0)
      group.device.master = device_part.to(spec.master_dtype(), false, /*copy=*/true);
    group.device.states = kernel.initial_states(group.device.master.defined() ? group.device.master : device_part);
  }
  group.sub_groups = std::move(sub_groups);
  group.host_sub_groups = on_host;
  return group;
}

}  // namespace

int64_t host_sub_groups(const EngineSpec& spec, const std::vector<std::shared_ptr<optim::OptimizerKernel>>& kernels,
                        const SubGroupRanges& sub_groups) {
  const auto& offload = spec.optimizer_offload;
  int64_t count = 0;
  for (const auto& g : sub_groups) count += int64_t(g.size());
  if (!offload.off_device()) return 0;
  if (offload.ratio >= 1.0) return count;
  for (const auto& k : kernels)
    if (k->whole_partition())
      throw ConfigError("zero_optimization.offload_optimizer.ratio = " + std::to_string(offload.ratio) +
                        ": partial offload steps sub-groups in two places, and a client optimizer (stepped by its own "
                        "step()) takes whole partitions: use the config's optimizer section, or ratio 1");
  const auto host = int64_t(std::floor(offload.ratio * double(count)));
  if ((host == 0 || host == count) && offload.ratio > 0.0 && spec.rank == 0)
    log::warn("zero_optimization.offload_optimizer.ratio = " + std::to_string(offload.ratio) + " of " + std::to_string(count) +
              " sub-groups a rank puts " + (host == 0 ? "none" : "all") + " of them on the host; a smaller "
              "sub_group_size gives the split a finer grain");
  return host;
}

PlacedStates place_optimizer_states(const EngineSpec& spec, const std::vector<std::shared_ptr<optim::OptimizerKernel>>& kernels,
                                    const std::vector<at::Tensor>& partitions, const SubGroupRanges& sub_groups,
                                    int64_t host_count, int64_t staging_slots) {
  int64_t count = 0;
  for (const auto& g : sub_groups) count += int64_t(g.size());
  const bool host = host_count > 0;
  const bool partial = host && host_count < count;
  const bool nvme = host && spec.optimizer_offload.placement == StatePlacement::nvme;
  PlacedStates out;
  if (partial) {
    std::vector<optim::SplitStateStore::Group> groups;
    int64_t host_left = host_count;
    for (size_t g = 0; g < partitions.size(); ++g) {
      const int64_t on_host = std::min<int64_t>(host_left, int64_t(sub_groups[g].size()));
      host_left -= on_host;
      groups.push_back(split_group(spec, *kernels[g], partitions[g], sub_groups[g], on_host));
    }
    auto store = std::make_unique<optim::SplitStateStore>(std::move(groups));
    out.split = store.get();
    out.store = std::move(store);
    return out;
  }
  std::vector<optim::MemoryStateStore::Group> groups;
  for (size_t g = 0; g < partitions.size(); ++g) {
    const auto& partition = partitions[g];
    optim::MemoryStateStore::Group group;
    // Offloaded, the master is a host copy even when no fp32 master is asked for (fp32 weights, or
    // bf16_master_weights_and_grads): in the dtype the device path would step in, so the bits match.
    const auto host_master = at::TensorOptions().device(at::kCPU).dtype(spec.master_dtype());
    if (nvme)  // the swap file gets the values sub-group by sub-group (below); here only the dtypes
      group.master = at::empty({0}, host_master);
    else if (host)
      group.master = partition.to(host_master, false, /*copy=*/true);
    else if (spec.fp32_master)
      group.master = partition.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    group.states = kernels[g]->initial_states(group.master.defined() ? group.master : partition);
    group.sub_groups = sub_groups[g];
    groups.push_back(std::move(group));
  }
  if (nvme)
    out.store = nvme_store(spec, kernels, partitions, groups, staging_slots, out.nvme);
  else
    out.store = std::make_unique<optim::MemoryStateStore>(std::move(groups));
  return out;
}

}  // namespace tessera::actors
