// EngineStorage: affine maps of everything a training engine stores per data-parallel rank, with
// this rank's buffers. It is what weight sync, resharding and checkpoints consume (docs/DESIGN.md §8).
//
// Kinds (each a map per parameter, named by its dotted name; ranks are data-parallel ranks):
//   "param"   the module's weights (fp32, bf16 or fp16): every rank holds every parameter (ZeRO 0-2)
//             in its flat parameter buffer at the parameter's offset; pieces list all ranks as holders.
//   "master"  fp32 master weights: ZeRO-1/2 partitions (rank r's buffer is partition r of the padded
//             flat group, a parameter may straddle partitions); stage 0: the whole group on every
//             rank. For fp32 training the master IS the weights' partition: its buffer aliases "param".
//   states    one kind per optimizer state ("exp_avg", "exp_avg_sq", "momentum_buffer", ...), laid
//             out like "master". Allocated at initialize: zeros (Adagrad: its initial accumulator) before the first step.
// Each flat group (parameter group; with autocast also split by the gradients' comm dtype) has
// its own buffers, keyed "<kind>/<group>" ("param/0", "exp_avg/1"); a map names its buffer.
// Padding is never part of a map. Example: stage 2, 2 ranks, parameters a (3, 5) and b (7,), f32:
// 22 elements padded to 24 (alignment 2 x 2 ranks), partitions of 12: "exp_avg" of a is Box((0,0)+(3,5))
// on rank 0 at 0 ... split as run_boxes() cuts [0, 12) and [12, 15) of a's row-major order.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"

namespace tessera {

struct StoredTensorMap {
  std::string kind;         // "param", "master", "exp_avg", ...
  std::string buffer;       // key of the buffer it describes in EngineStorage::buffers
  affine::TensorMap map;    // map.name is the parameter's dotted name
};

// The affine dtype of an engine buffer (f32, bf16, f16, f64; an Error names any other), and back.
affine::DType affine_dtype(at::ScalarType type);
at::ScalarType scalar_type(affine::DType dtype);

struct EngineStorage {
  std::vector<StoredTensorMap> maps;
  std::map<std::string, at::Tensor> buffers;  // this rank's flat buffers, by "<kind>/<group>"

  static std::string buffer_key(const std::string& kind, int64_t group) { return kind + "/" + std::to_string(group); }
};

}  // namespace tessera
