// Partial optimizer offload (zero_optimization.offload_optimizer.ratio): a StateStore whose first
// sub-groups of the rank, in update order (flat group by flat group), keep their master and
// states in host memory and the rest beside the parameters (DeepSpeed assigns its sub-groups the
// same way: the first ratio x count on the CPU). Within a flat group the host sub-groups are a
// prefix, so a group has at most two parts: [0, split) on the host, [split, partition) beside the
// parameters; at most one group per rank has both.
//
// partition_master()/partition_states() (storage maps, checkpoints, refresh: between steps only)
// of a group with both parts page them into one host tensor each and lend those until the next
// acquire() or settle(), which writes them back into the parts (as NvmeStateStore does); a group
// in one part lends its own tensors.
//
// Example: ratio 0.5 over 3 flat groups of 2 sub-groups each: group 0 wholly on the host, group 1's
// first sub-group on the host and its second on the device, group 2 wholly on the device.
#pragma once

#include <optional>

#include "core/optim/state_store.h"

namespace tessera::optim {

class SplitStateStore final : public StateStore {
 public:
  struct Part {
    at::Tensor master;               // over the part; undefined: the weights are the master
    std::vector<at::Tensor> states;  // each over the part, in the kernel's state_names() order
  };
  struct Group {
    std::vector<std::pair<int64_t, int64_t>> sub_groups;  // [begin, end) of the partition, contiguous from 0
    int64_t host_sub_groups = 0;                          // the first ones, in `host`
    Part host;    // [0, split): host memory
    Part device;  // [split, partition): beside the parameters
  };
  explicit SplitStateStore(std::vector<Group> groups);  // checks the parts' sizes and dtypes

  SubGroupState acquire(int64_t group, int64_t sub_group) override;
  void release(int64_t, int64_t) override {}
  at::Tensor partition_master(int64_t group) const override;
  std::vector<at::Tensor> partition_states(int64_t group) const override;
  int64_t master_bytes() const override { return host_master_bytes() + device_master_bytes(); }
  int64_t state_bytes() const override { return host_state_bytes() + device_state_bytes(); }

  bool on_host(int64_t group, int64_t sub_group) const;
  // Bytes of the host parts (with paged-in partitions: host memory too) and of the device parts.
  int64_t host_master_bytes() const { return bytes_held(Side::host, Held::master); }
  int64_t host_state_bytes() const { return bytes_held(Side::host, Held::states); }
  int64_t device_master_bytes() const { return bytes_held(Side::device, Held::master); }
  int64_t device_state_bytes() const { return bytes_held(Side::device, Held::states); }
  // The device parts' masters and states (what offload_states moves; the host parts are there).
  std::vector<at::Tensor> device_masters() const;
  std::vector<at::Tensor> device_states() const;
  // Writes paged-in partitions back into the parts and frees them.
  void settle();

 private:
  enum class Side : uint8_t { host, device };
  enum class Held : uint8_t { master, states };
  int64_t bytes_held(Side side, Held held) const;
  const Group& group_at(int64_t group) const;
  int64_t split(const Group& g) const;
  const Part& page_in(int64_t group) const;

  std::vector<Group> groups_;
  mutable std::vector<std::optional<Part>> paged_;  // per group: the whole partitions, lent
};

}  // namespace tessera::optim
