#include "actors/partition_weights.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/zero/parameter_swap.h"

namespace tessera::actors {

PartitionWeights::PartitionWeights(const Buffers& partitions) : tensors_(partitions.tensors), swap_(partitions.swap) {}

at::Tensor PartitionWeights::acquire(size_t group, int64_t begin, int64_t end) const {
  if (!swap_) return tensors_.at(group).narrow(0, begin, end - begin);
  const auto& partition = swap_->partitions().at(group);
  auto values = at::empty({end - begin}, at::dtype(partition.dtype));
  swap_->read(int64_t(group), begin, values);
  return values;
}

void PartitionWeights::release(size_t group, int64_t begin, const at::Tensor& written) const {
  if (swap_) swap_->write(int64_t(group), begin, written);
}

}  // namespace tessera::actors
