// Stage3Parameters is one rank's ZeRO-3 parameter storage (the layout is unit_layout.h's):
//   - per flat group, the weight buffer: the rank's partition [P_g] (what the optimizer steps),
//     then the gathered persistent segment, of which the persistent parameters are views;
//   - per unit, one storage (c10::StorageImpl) of which the unit's parameters are views. Its
//     memory exists only while the unit is gathered: release() frees it at storage level and
//     materialize() allocates it again (reference/zero3_hooks.md, Scheme B'), so parameters keep
//     their TensorImpl, shape, autograd meta, version counter and pinned AccumulateGrad, and the
//     tensors autograd saved (views such as w.t()) see the re-gathered values.
// Filling a gathered unit is the caller's (a collective over the segments' pieces): this class
// allocates, frees and hands out views; it talks to nobody.
//
// Construction copies the parameters' values (rounded to `dtype`) into a unit's storage, rebinds
// them (set_data), copies this rank's pieces into the partitions and releases the unit, one unit
// at a time: peak memory is the model as the caller built it plus the largest unit.
//
// With WeightHome::host the weight buffers (partitions, persistent segments) are host memory and
// the persistent parameters views of it: parameter offload. With WeightHome::nvme the partitions
// are in a ParameterSwap (gathers read this rank's pieces from it, write-backs write them) and the
// persistent segments in host memory; partition()/weight_buffer() then lend the whole buffer,
// paged into host memory (the optimizer's step, storage maps, checkpoints), until the next
// read_piece/write_piece/persistent_segment/settle_lent writes it back into the swap.
//
// Example: 2 ranks, l1.weight (3, 5) in unit l1: its storage holds 16 elements (15 + 1 padding)
// while gathered, 0 bytes while released; rank 1's partition holds l1.weight's flat [8, 15).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/zero/parameter_swap.h"
#include "core/zero/sharding_plan.h"
#include "core/zero/weight_home.h"

namespace tessera::zero {

class Stage3Parameters {
 public:
  // `parameters`: the plan's parameters in its order (model-wide index), full-shaped, one device.
  // `fill(i, view)`, when given, may write parameter i's values into `view` itself (true) instead
  // of them being copied from the parameter (a parameter cut at construction has no memory).
  using Fill = std::function<bool(int64_t param, const at::Tensor& view)>;
  // `swap`: the swap file's options, given exactly when home is WeightHome::nvme.
  Stage3Parameters(const ShardingPlan& plan, int rank, const std::vector<at::Tensor>& parameters, at::ScalarType dtype,
                   const Fill& fill = nullptr, WeightHome home = WeightHome::with_units,
                   std::optional<ParameterSwapOptions> swap = std::nullopt);
  ~Stage3Parameters();
  Stage3Parameters(const Stage3Parameters&) = delete;
  Stage3Parameters& operator=(const Stage3Parameters&) = delete;

  const ShardingPlan& plan() const { return *plan_; }
  int rank() const { return rank_; }
  WeightHome home() const { return home_; }
  // The weight buffer [partition | persistent segment] and the partition (nvme: lent, see above).
  at::Tensor weight_buffer(int64_t group);
  at::Tensor partition(int64_t group);
  // This rank's piece of a segment ([partition_numel] of its group's partition) into `dst` / from
  // `src` (any device and dtype: copy_ converts, as a copy from the piece itself would).
  void read_piece(int64_t segment, const at::Tensor& dst);
  void write_piece(int64_t segment, const at::Tensor& src);
  // Reads ahead the pieces of a unit's segments (nvme; nothing otherwise).
  void prefetch_pieces(int64_t unit);
  // The gathered persistent segment of a group ([padded_numel], in host memory or inside the
  // weight buffer), or undefined.
  at::Tensor persistent_segment(int64_t group);
  // nvme: lent weight buffers back into the swap (and their persistent segments into place);
  // one unchanged since it was lent is only dropped.
  void settle_lent();
  const ParameterSwap* swap() const { return swap_.get(); }
  // nvme: the swap, for the optimizer's range-by-range updates (settle_lent() first).
  std::shared_ptr<ParameterSwap> shared_swap() const { return swap_; }
  // Bytes of the weight buffers in memory now (nvme: the persistent segments and what is lent).
  int64_t resident_weight_bytes() const;

  bool gathered(int64_t unit) const { return units_.at(size_t(unit)).live; }
  // Allocates unit `unit`'s storage (contents undefined) and returns a flat alias of it
  // ([gathered_numel], the plan's dtype); a gathered unit's alias is returned as is.
  at::Tensor materialize(int64_t unit);
  // A gathered unit's flat alias (undefined when released).
  at::Tensor alias(int64_t unit) const;
  void release(int64_t unit);
  void release_all();
  int64_t gathered_bytes() const;  // every gathered unit's storage

 private:
  struct UnitStorage {
    c10::intrusive_ptr<c10::StorageImpl> storage;
    int64_t nbytes = 0;
    bool live = false;
  };
  const ShardingPlan* plan_;
  int rank_;
  WeightHome home_;
  at::TensorOptions options_;        // of the units
  at::Tensor piece(int64_t segment) const;  // resident homes: a view into the partition
  at::Tensor lend(int64_t group);
  std::vector<at::Tensor> weights_;  // per flat group, where home_ says (nvme: [partition_numel, end) only)
  std::shared_ptr<ParameterSwap> swap_;
  std::vector<at::Tensor> lent_;  // nvme: per flat group, the whole weight buffer paged in, or undefined
  std::vector<uint64_t> lent_hashes_;  // nvme: XXH3 of each lent buffer as it was paged in
  std::vector<UnitStorage> units_;
};

}  // namespace tessera::zero
