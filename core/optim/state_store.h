// A StateStore holds what the optimizer keeps for this rank's partitions: per flat group, the fp32
// master partition (mixed precision; absent when the weights are their own master) and one
// partition per optimizer state, and lends them one sub-group at a time, so that offload (host or
// NVMe stores behind this interface) can keep only the sub-group being stepped in memory.
//
// Owner: the optimizer-shard actor; nobody else touches a store. acquire(g, s) returns views of
// sub-group s of group g, valid until release(g, s); partition_master()/partition_states() give
// the whole partitions (storage maps, checkpoints) between steps.
//
// Example: a flat group with partitions of 2,500 elements and sub-groups [0, 1000), [1000, 2000),
// [2000, 2500) under AdamW: acquire(0, 2) gives master[2000, 2500), exp_avg[2000, 2500) and
// exp_avg_sq[2000, 2500).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::optim {

struct SubGroupState {
  at::Tensor master;               // undefined when the weights are the master
  std::vector<at::Tensor> states;  // in the kernel's state_names() order
};

class StateStore {
 public:
  virtual ~StateStore() = default;
  virtual SubGroupState acquire(int64_t group, int64_t sub_group) = 0;
  virtual void release(int64_t group, int64_t sub_group) = 0;
  virtual at::Tensor partition_master(int64_t group) const = 0;
  virtual std::vector<at::Tensor> partition_states(int64_t group) const = 0;
  // Bytes held in memory now: masters and states.
  virtual int64_t master_bytes() const = 0;
  virtual int64_t state_bytes() const = 0;
};

// Everything in memory, allocated once at construction.
class MemoryStateStore final : public StateStore {
 public:
  struct Group {
    at::Tensor master;                    // [partition] or undefined
    std::vector<at::Tensor> states;       // each [partition]
    std::vector<std::pair<int64_t, int64_t>> sub_groups;  // [begin, end) of the partition
  };
  explicit MemoryStateStore(std::vector<Group> groups);

  SubGroupState acquire(int64_t group, int64_t sub_group) override;
  void release(int64_t, int64_t) override {}
  at::Tensor partition_master(int64_t group) const override { return groups_.at(size_t(group)).master; }
  std::vector<at::Tensor> partition_states(int64_t group) const override { return groups_.at(size_t(group)).states; }
  int64_t master_bytes() const override;
  int64_t state_bytes() const override;

 private:
  std::vector<Group> groups_;
};

}  // namespace tessera::optim
