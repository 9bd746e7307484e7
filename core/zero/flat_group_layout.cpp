#include "core/zero/flat_group_layout.h"

#include <algorithm>

#include "core/affine/zero_storage.h"
#include "core/error.h"

namespace tessera::zero {

FlatGroupLayout make_flat_group_layout(const std::vector<std::string>& names, const std::vector<int64_t>& numels,
                                       int64_t dp_size, int64_t alignment_elements) {
  if (names.size() != numels.size())
    throw Error("flat group layout: " + std::to_string(names.size()) + " names but " +
                std::to_string(numels.size()) + " sizes");
  if (dp_size < 1) throw Error("flat group layout: data-parallel size " + std::to_string(dp_size) + " < 1");
  if (alignment_elements < 1)
    throw Error("flat group layout: alignment " + std::to_string(alignment_elements) + " < 1");
  FlatGroupLayout layout;
  layout.dp_size = dp_size;
  for (size_t i = 0; i < names.size(); ++i) {
    if (numels[i] < 0)
      throw Error("flat group layout: parameter '" + names[i] + "' has negative size " + std::to_string(numels[i]));
    layout.params.push_back({names[i], numels[i], layout.numel});
    layout.numel += numels[i];
  }
  // The storage maps (affine::zero12_flat_group) describe this layout: one rule for both.
  layout.partition_numel = affine::zero12_partition_elements(layout.numel, int(dp_size), alignment_elements);
  layout.padded_numel = layout.partition_numel * dp_size;
  return layout;
}

std::vector<PartitionFragment> FlatGroupLayout::fragments(int64_t rank) const {
  if (rank < 0 || rank >= dp_size)
    throw Error("flat group layout: rank " + std::to_string(rank) + " outside [0, " + std::to_string(dp_size) + ")");
  const int64_t begin = partition_begin(rank), end = begin + partition_numel;
  std::vector<PartitionFragment> out;
  // Parameters are sorted by offset: find the first one ending after `begin`.
  auto it = std::upper_bound(params.begin(), params.end(), begin,
                             [](int64_t b, const ParameterSlot& p) { return b < p.offset + p.numel; });
  for (; it != params.end() && it->offset < end; ++it) {
    if (it->numel == 0) continue;
    const int64_t lo = std::max(begin, it->offset), hi = std::min(end, it->offset + it->numel);
    if (lo < hi) out.push_back({int64_t(it - params.begin()), lo - it->offset, lo, hi - lo});
  }
  return out;
}

int64_t FlatGroupLayout::padding_in_partition(int64_t rank) const {
  const int64_t begin = partition_begin(rank), end = begin + partition_numel;
  return end - std::max(begin, std::min(end, numel));
}

}  // namespace tessera::zero
