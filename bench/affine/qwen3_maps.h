// Storage maps of a Qwen3-8B-shaped model (36 layers; hidden 4096, intermediate 12288, 32 query heads,
// 8 KV heads, head dim 128, vocab 151936), for the affine benchmark.
//
// Training job: TP2 x DP4 on 8 global ranks, global rank = dp * 2 + tp. AutoTP layout: q/k/v/gate/up
// split along dim 0 (output features), o/down along dim 1, embedding along dim 1 (hidden), lm_head
// along dim 0 (vocab), norms replicated. ZeRO-2: bf16 params replicated over DP, fp32 master in one
// flat group per TP rank (alignment 2 x DP). ZeRO-3: bf16 params as per-tensor partitions, fp32 master
// as one flat sub-group per TP rank. Rollout job: the same AutoTP layout at TP4 (4 ranks).
#pragma once

#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/builders.h"

namespace tessera::affine::bench {

struct ModelTensor {
  TensorInfo info;
  int split_dim;  // -1: replicated
};

std::vector<ModelTensor> qwen3_8b_tensors(DType dtype);

std::vector<TensorMap> tp_layout_maps(const std::vector<ModelTensor>& model, int tp);
// kind: "zero2_params", "zero2_master", "zero3_params", "zero3_master"
std::vector<TensorMap> training_storage_maps(const std::vector<ModelTensor>& model, int tp, int dp, const std::string& kind);

}  // namespace tessera::affine::bench
