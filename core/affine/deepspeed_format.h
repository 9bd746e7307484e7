// Import and export of DeepSpeed's AffineIR dictionaries, so maps and plans can be exchanged with
// DeepSpeed-based jobs (ParamAffineMap.to_dict, TransferPlan.to_dict; affine_notes.md §1.4, §2.1).
//
// DeepSpeed map: {"logical_shape": [..], "ranks": {"<rank>": {"shard_shape": [..], "pieces": [
//   {"shape": [..], "source": [offset, [strides]], "dest": [offset, [strides]], "locations": [..]}]}}}
// where "source" addresses the row-major logical tensor and "dest" the rank's shard; "scale" appears
// only when != 1. Import decodes "source" into a Box (its strides must be the tensor's row-major
// strides on every axis of extent > 1, else UnsupportedLayoutError; an offset that is not a
// coordinate is an InvalidMapError), takes "dest" as storage offset/strides, the shard's numel as
// buffer_elements and shard_shape as buffer_shape; a scale other than 1 is UnsupportedLayoutError.
// Export writes buffer_shape (or [buffer_elements]) as shard_shape. Ranks are sorted.
// DeepSpeed plan: {"logical_shape": [..], "segments": [{"shape": [..], "source": [rank, offset,
//   [strides]], "target": [rank, offset, [strides]]}]} (no logical_origin).
// A checkpoint embeds maps as {"version": 1, "params": {"^<escaped name>$": map}}.
//
// Example: rank "1" of the (8,8) row split exports as {"shard_shape": [4, 8], "pieces": [{"shape":
// [4, 8], "source": [32, [8, 1]], "dest": [0, [8, 1]], "locations": [1]}]}.
#pragma once

#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/plan.h"

namespace tessera::affine {

std::string map_to_deepspeed_json(const TensorMap& map, int indent = -1);
TensorMap map_from_deepspeed_json(const std::string& text, const std::string& name, DType dtype = DType::f32);

std::string plan_to_deepspeed_json(const Plan& plan, int indent = -1);
// The plan's digest fields are recomputed; statistics other than the segment ones are zero.
Plan plan_from_deepspeed_json(const std::string& text, const std::string& name, DType dtype = DType::f32);

// {"version": 1, "params": {"^name$": map}} <-> maps (names unescaped / escaped as DeepSpeed does).
std::string maps_to_deepspeed_json(const std::vector<TensorMap>& maps, int indent = -1);
std::vector<TensorMap> maps_from_deepspeed_json(const std::string& text, DType dtype = DType::f32);

// Reads any of: a tessera map or map set, a DeepSpeed map, a DeepSpeed {"params": ...} document
// (optionally wrapped as {"affine_map": ...}). Names default to "tensor" for a bare DeepSpeed map.
std::vector<TensorMap> read_maps_any_format(const std::string& text);

}  // namespace tessera::affine
