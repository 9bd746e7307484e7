// How a tensor-parallel group of `size` ranks splits a decoder's weights (vLLM's scheme), and the
// three collectives the sharded model calls. size 1 is the plain, unsharded model.
//
//   q_proj, k_proj, v_proj, gate_proj, up_proj (weight rows, bias)   column-parallel: split dim 0
//   o_proj, down_proj (weight columns)                                row-parallel: split dim 1,
//                                                                     outputs summed (all_reduce)
//   embed_tokens, lm_head (rows)                                      vocabulary-parallel: the
//       vocabulary is padded to a multiple of `size` (zero rows), each rank holds V_pad / size rows
//   norms, q_norm/k_norm, o_proj/down_proj biases                     replicated
// Attention heads go whole to one rank: H % size == 0. KV heads too when KV >= size (KV % size ==
// 0); when size > KV (size % KV == 0) each rank holds the one KV head its query heads use, so
// size / KV ranks hold replicas of each (as vLLM does).
//
// The collectives are callbacks so that core/ stays free of transport: the rollout engine binds
// them to a Communicator; size 1 needs none.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/decoder_config.h"

namespace tessera::nn {

struct TensorParallel {
  int rank = 0;
  int size = 1;
  // Sum of every rank's tensor, in place (a contiguous tensor; every rank gets the same bytes).
  std::function<void(at::Tensor&)> all_reduce_sum;
  // The concatenation of every rank's flat, contiguous tensor (size * numel elements).
  std::function<at::Tensor(const at::Tensor&)> all_gather;
  // Rank 0's tensor, in place on every rank.
  std::function<void(at::Tensor&)> broadcast;

  bool sharded() const { return size > 1; }
};

// This rank's slice of one weight along `dim` (-1: replicated, the whole tensor).
struct TpShard {
  int dim = -1;
  int64_t begin = 0;          // first index along dim in the full tensor
  int64_t length = 0;         // indices taken from the full tensor
  int64_t local_length = 0;   // indices of the local tensor (length + zero padding: vocabulary)
};

// Refuses (tessera::ConfigError naming the key) a TP size this config cannot be split by.
void check_tp_size(const DecoderConfig& config, int tp_size);
// The vocabulary rounded up to a multiple of tp_size.
int64_t padded_vocab_size(const DecoderConfig& config, int tp_size);
// Query heads and KV heads on one rank.
int64_t local_heads(const DecoderConfig& config, int tp_size);
int64_t local_kv_heads(const DecoderConfig& config, int tp_size);

// The full (unsharded, Hugging Face) shape of every parameter, in module order.
std::vector<std::pair<std::string, std::vector<int64_t>>> decoder_parameter_shapes(const DecoderConfig& config);
// One parameter's full shape by name, without listing the others; nullopt for a name the model lacks.
std::optional<std::vector<int64_t>> decoder_parameter_shape(const DecoderConfig& config, const std::string& name);
// Rank `tp_rank`'s slice of parameter `name` (a Hugging Face name; Error when unknown).
TpShard decoder_tp_shard(const DecoderConfig& config, const std::string& name, int tp_rank, int tp_size);
// The local tensor of `shard` cut from the full tensor (a copy; padding rows are zeros).
at::Tensor cut_shard(const at::Tensor& full, const TpShard& shard);

}  // namespace tessera::nn
