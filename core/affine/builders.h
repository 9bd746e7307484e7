// Builders of layout maps: where the tensor-parallel (AutoTP-style) shards of a tensor live. Each
// returns a TensorMap over ranks 0..degree-1 whose rank r's buffer is its shard, stored row-major,
// with buffer_shape = the shard's shape (so nest() can place ZeRO storage inside it).
//
// Invariants of every result: pieces are N-D boxes with the shard's row-major strides; holders are
// the ranks holding exactly the same box (replicated parts); zero-width parts give empty pieces that
// keep the running offset; the map validates and covers the tensor.
//
// Example: contiguous_split({"w", f32, (10, 4)}, 0, {3, 3, 2, 2}) gives rank 2 the piece
// Box((6,0)+(2,4)) at offset 0 with strides (4,1) in a buffer of shape (2,4).
// sub_param_split({"qkv", f32, (12, 8)}, 0, {8, 2, 2}, even widths over 2 ranks) gives rank 1 the
// pieces Box((4,0)+(4,8)) at 0, Box((9,0)+(1,8)) at 32, Box((11,0)+(1,8)) at 40 in a (6,8) buffer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"

namespace tessera::affine {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Dims shape;
};

// Split sizes used by even splits: `total` over `parts`, the first total % parts parts one larger
// (10 over 4 -> 3,3,2,2).
std::vector<int64_t> even_split_sizes(int64_t total, int parts);

// Every rank holds the whole tensor.
TensorMap replicated(const TensorInfo& info, int degree);

// Rank r holds sizes[r] consecutive indices of axis `dim` (uneven and zero allowed; must sum to the extent).
TensorMap contiguous_split(const TensorInfo& info, int dim, const std::vector<int64_t>& sizes);

// Fused sub-parameters along `dim` (QKV with q, k, v sizes, or gate/up): sub-parameter i of size
// sub_sizes[i] is split with widths[i][r]; rank r's shard concatenates its part of each sub-parameter
// in order (AutoTP's `shape` + `partition_dim`).
TensorMap sub_param_split(const TensorInfo& info, int dim, const std::vector<int64_t>& sub_sizes,
                          const std::vector<std::vector<int64_t>>& widths);
// Same with every sub-parameter split by even_split_sizes over `degree` ranks.
TensorMap sub_param_split_even(const TensorInfo& info, int dim, const std::vector<int64_t>& sub_sizes, int degree);

// Ordered segments along `dim`: a split segment is cut with `widths` (one per rank), a replicated one
// is held whole by every rank (bigcode: query rows split, KV rows replicated).
struct LayoutSegment {
  int64_t size = 0;
  bool replicated = false;
  std::vector<int64_t> widths;  // split segments: one width per rank, summing to size
};
TensorMap segmented(const TensorInfo& info, int dim, const std::vector<LayoutSegment>& segments, int degree);

// Equal blocks of `block_size` along `dim`; rank r holds blocks block_ids_by_rank[r] in that order
// (any ids, any order); runs of consecutive ids become one piece.
TensorMap block_gather(const TensorInfo& info, int dim, int64_t block_size,
                       const std::vector<std::vector<int64_t>>& block_ids_by_rank);

}  // namespace tessera::affine
