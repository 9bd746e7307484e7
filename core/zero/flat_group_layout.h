// A FlatGroupLayout is where each parameter of one ZeRO-1/2 parameter group lives in the group's
// flat buffer, and which contiguous slice of that buffer each data-parallel rank owns.
//
// Parameters are concatenated in order (no gaps between them); the group is then padded at the
// end to a multiple of `dp_size * alignment_elements` and cut into `dp_size` equal partitions. A
// parameter may straddle two or more partitions; padding belongs to no parameter and never
// reaches the optimizer's results or the storage maps.
//
// Example: numels {35, 13, 24, 1} = 73 elements, dp 3, alignment 1: padded to 75, partitions of
// 25. Rank 1 owns flat [25, 50): parameter 0 elements [25, 35) and parameter 1 [0, 13) at flat
// 35, and parameter 2 elements [0, 2) at flat 48. Fragments list exactly that.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::zero {

// One parameter's place in the flat buffer: elements [offset, offset + numel).
struct ParameterSlot {
  std::string name;
  int64_t numel = 0;
  int64_t offset = 0;
};

// The part of one parameter inside one rank's partition: parameter elements
// [param_begin, param_begin + length) sit at flat offset flat_begin (end exclusive throughout).
struct PartitionFragment {
  int64_t param_index = 0;
  int64_t param_begin = 0;
  int64_t flat_begin = 0;
  int64_t length = 0;
};

struct FlatGroupLayout {
  std::vector<ParameterSlot> params;
  int64_t dp_size = 1;
  int64_t numel = 0;           // sum of the parameters' numels
  int64_t padded_numel = 0;    // numel rounded up to dp_size * alignment (0 for an empty group)
  int64_t partition_numel = 0; // padded_numel / dp_size

  int64_t partition_begin(int64_t rank) const { return rank * partition_numel; }
  // Parameter fragments inside `rank`'s partition, in flat order (padding excluded).
  std::vector<PartitionFragment> fragments(int64_t rank) const;
  // Padding elements inside `rank`'s partition (they sit at its end).
  int64_t padding_in_partition(int64_t rank) const;
};

// Lays out `names`/`numels` for `dp_size` ranks; each partition's length is a multiple of
// `alignment_elements` (DeepSpeed aligns partitions to 2 elements for NCCL). Throws
// tessera::Error on dp_size < 1, alignment < 1, a negative numel or mismatched list lengths.
FlatGroupLayout make_flat_group_layout(const std::vector<std::string>& names, const std::vector<int64_t>& numels,
                                       int64_t dp_size, int64_t alignment_elements = 1);

}  // namespace tessera::zero
