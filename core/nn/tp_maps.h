// The affine maps of a decoder as a tensor-parallel group stores it (docs/DESIGN.md §8.2): for each
// parameter, TP rank r's buffer is its local tensor (row-major, the local shape), holding the box
// of the full Hugging Face tensor that decoder_tp_shard() names. Vocabulary padding rows are in the
// buffer but not in the map; ranks holding the same slice (KV heads replicated past their number,
// norms, row-parallel biases) list each other as holders.
//
// Example: Qwen2 with 1 KV head at TP 4: k_proj.weight [hd, d] is one box held by {0,1,2,3};
// embed_tokens [V=101, d] pads to 104 rows: rank 3 holds rows 78..100 (23 of its 26).
#pragma once

#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/nn/decoder_config.h"

namespace tessera::nn {

affine::TensorMap decoder_tp_map(const DecoderConfig& config, const std::string& name, int tp_size, affine::DType dtype);
// Every parameter's map, in decoder_parameter_shapes() order.
std::vector<affine::TensorMap> decoder_tp_maps(const DecoderConfig& config, int tp_size, affine::DType dtype);

}  // namespace tessera::nn
