// The optimizer-shard's access to this rank's weight partitions during one step or refresh: views
// of the partitions where they are in memory, or (parameters on NVMe) ranges read from and written
// back into the parameters' swap file, one sub-group at a time, so that host memory holds the
// swap's buffers and one sub-group's weights, not the partition.
//
// acquire(g, begin, end) returns the range's current values in a tensor the caller may write;
// release(g, begin, t) makes what was written the partition's (a view: already; the swap: written).
//
// Example: a bf16 partition of 100 M elements on NVMe, sub-groups of 1 M: a step reads and writes
// 2 MB at a time through the swap's chunks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "actors/protocol.h"

namespace tessera::actors {

class PartitionWeights {
 public:
  explicit PartitionWeights(const Buffers& partitions);  // Buffers.tensors, or Buffers.swap
  at::Tensor acquire(size_t group, int64_t begin, int64_t end) const;
  void release(size_t group, int64_t begin, const at::Tensor& written) const;
  bool swapped() const { return swap_ != nullptr; }

 private:
  std::vector<at::Tensor> tensors_;
  std::shared_ptr<zero::ParameterSwap> swap_;
};

}  // namespace tessera::actors
