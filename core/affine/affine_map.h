// A TensorMap (affine map) says where every element of one logical tensor is stored: for each rank,
// the pieces it holds, each a logical Box of the tensor plus the storage address of the box's first
// element in that rank's flat 1-D buffer and the storage strides of each axis.
//
// Element i of piece p (i inside p.box) lives at address p.offset + sum_k (i[k] - p.box.origin[k]) *
// p.strides[k] of the rank's buffer, counted in elements (multiply by element_size(dtype) for bytes).
//
// Invariants checked by validate_map() and plan() (not by construction, so a map can be loaded and
// then diagnosed):
//   - every box lies inside `shape`; strides are non-negative and nest (no two elements of one piece
//     share an address); every address lies inside [0, buffer_elements) of its rank;
//   - two pieces of one rank never share an address and never hold the same logical element;
//   - a rank's buffer may have holes (ZeRO padding, other tensors' data): pieces need not tile it;
//   - replicas: piece.holders lists every rank that stores a copy of the box (sorted, including the
//     piece's own rank); each holder stores all of it, in one piece or cut differently, and no other
//     rank stores any part of it (holders are the same for every element of a piece);
//   - a source map covers the tensor exactly once up to replicas; padding is never part of a map.
// Ranks are labels inside one map ({3, 9} is fine); source and target rank spaces are unrelated.
//
// Example: an (8, 8) f32 weight split by rows over 2 ranks:
//   shape (8,8); rank 0: buffer 32 elements, piece Box((0,0)+(4,8)) offset 0 strides (8,1) holders {0}
//                rank 1: buffer 32 elements, piece Box((4,0)+(4,8)) offset 0 strides (8,1) holders {1}
// The same weight as ZeRO-3 partitions over 3 ranks (22 elements each, 2 of padding on rank 2):
//   rank 1 holds elements [22, 44): Box((2,6)+(1,2)) at 0, Box((3,0)+(2,8)) at 2, Box((5,0)+(1,4)) at 18,
//   all with strides (8,1) (see run_boxes.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/box.h"
#include "core/affine/dtype.h"

namespace tessera::affine {

struct Piece {
  Box box;                   // logical region of the tensor
  int64_t offset = 0;        // storage address (elements) of box.origin in the rank's buffer
  Dims strides;              // storage stride (elements) of each logical axis
  std::vector<int> holders;  // ranks holding copies of every element of `box`, sorted, incl. own rank

  // Storage address of logical index `index` (which must lie in box).
  int64_t address_of(const Dims& index) const;
  // Highest storage address the piece touches (offset for a 1-element piece); undefined when empty.
  int64_t last_address() const;
  friend bool operator==(const Piece& a, const Piece& b);
  friend bool operator!=(const Piece& a, const Piece& b) { return !(a == b); }
};

struct RankStorage {
  int64_t buffer_elements = 0;  // size of the rank's flat buffer (elements)
  // Optional N-D shape the buffer has as a tensor (a TP shard's shape); empty means "flat".
  // Used by nest() and by the DeepSpeed export (shard_shape); product must equal buffer_elements.
  Dims buffer_shape;
  std::vector<Piece> pieces;
  friend bool operator==(const RankStorage& a, const RankStorage& b);
};

struct TensorMap {
  std::string name;  // dotted parameter name (+ state name), used in every error message
  DType dtype = DType::f32;
  Dims shape;  // logical (global) shape
  std::map<int, RankStorage> ranks;

  int64_t numel() const { return shape.product(); }
  int64_t piece_count() const;  // nonempty and empty pieces of all ranks
  friend bool operator==(const TensorMap& a, const TensorMap& b);
  friend bool operator!=(const TensorMap& a, const TensorMap& b) { return !(a == b); }
};

// "tensor 'name'" for messages.
std::string describe(const TensorMap& map);

// Sets every piece's holders to the set of ranks that hold a piece with exactly the same box
// (the replicas a builder created). O(n log n).
void assign_holders_by_box(TensorMap& map);

}  // namespace tessera::affine
