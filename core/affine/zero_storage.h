// Storage maps of ZeRO: where a data-parallel group of `dp` ranks keeps each element of a tensor
// (or of a TP shard, before nest()). Ranks are DP ranks 0..dp-1; padding is never part of a map.
//
//   ZeRO-0/1/2 low-precision parameters: every DP rank holds the whole tensor  -> replicated().
//   ZeRO-1/2 fp32 master and optimizer states: the group's tensors are concatenated in order, padded
//     at the end to a multiple of dp * alignment, and cut into dp equal partitions of P elements;
//     rank r's buffer is partition r (P elements); a tensor may straddle partitions.
//   ZeRO-3 parameters: each tensor is padded to a multiple of dp and cut into dp partitions of
//     P = ceil(numel / dp); rank r's buffer (its ds_tensor) holds [r*P, min((r+1)*P, numel)), a
//     rank past the end holds nothing.
//   ZeRO-3 fp32 master / states: per sub-group, each rank concatenates its P_i-element partition of
//     every tensor i of the group (padding included in the buffer, excluded from the maps).
// Each stored run is cut by run_boxes() into at most 2*ndim-1 N-D boxes.
//
// Example: zero12_flat_group({a: (3,5), b: (7,)}, dp = 4) -> 22 elements padded to 24, P = 6:
// a's elements [0,15) live on rank 0 [0,6), rank 1 [0,6), rank 2 [0,3); b's elements [0,7) on rank 2
// [3,6) and rank 3 [0,4); rank 3's last 2 elements are padding. a on rank 1 is Box((1,1)+(1,4)) at 0
// and Box((2,0)+(1,2)) at 4.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/affine/builders.h"

namespace tessera::affine {

// One contiguous run of a tensor's row-major elements in a rank's flat buffer: elements
// [begin, end) of the tensor at addresses [address, address + end - begin) of rank `rank`.
struct StoredRun {
  int rank = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t address = 0;
};

// The map of a tensor stored as `runs` (the general form of every builder below): each run is cut
// by run_boxes(); holders are the ranks storing exactly the same box (assign_holders_by_box), so
// runs repeated on several ranks are replicas. `buffer_elements[r]` is rank r's buffer size; a
// rank listed there without runs holds nothing of the tensor.
TensorMap stored_runs(const TensorInfo& tensor, const std::vector<StoredRun>& runs,
                      const std::map<int, int64_t>& buffer_elements);

// Maps of the tensors of one ZeRO-1/2 flat group, in input order.
std::vector<TensorMap> zero12_flat_group(const std::vector<TensorInfo>& tensors, int dp, int64_t alignment = 1);

// P of zero12_flat_group: `total` elements padded to a multiple of dp * alignment, over dp. The
// one place this arithmetic lives (core/zero's FlatGroupLayout uses it too).
int64_t zero12_partition_elements(int64_t total, int dp, int64_t alignment = 1);

// ZeRO-3 partition map of one tensor (rank r's buffer is its P-element ds_tensor).
TensorMap zero3_partition(const TensorInfo& tensor, int dp);

// Maps of the tensors of one ZeRO-3 fp32 sub-group, in input order.
std::vector<TensorMap> zero3_flat_group(const std::vector<TensorInfo>& tensors, int dp);

// P of zero3_partition: ceil(numel / dp).
int64_t zero3_partition_elements(int64_t numel, int dp);

}  // namespace tessera::affine
