#include "qwen3_maps.h"

#include <map>

#include "core/affine/nest.h"
#include "core/affine/zero_storage.h"

namespace tessera::affine::bench {

std::vector<ModelTensor> qwen3_8b_tensors(DType dtype) {
  const int64_t hidden = 4096, inter = 12288, heads = 32, kv_heads = 8, head_dim = 128, vocab = 151936;
  std::vector<ModelTensor> out;
  auto add = [&](const std::string& name, Dims shape, int split) { out.push_back({{name, dtype, shape}, split}); };
  add("model.embed_tokens.weight", {vocab, hidden}, 1);
  for (int l = 0; l < 36; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden}, 0);
    add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden}, 0);
    add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden}, 0);
    add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim}, 1);
    add(p + "self_attn.q_norm.weight", {head_dim}, -1);
    add(p + "self_attn.k_norm.weight", {head_dim}, -1);
    add(p + "mlp.gate_proj.weight", {inter, hidden}, 0);
    add(p + "mlp.up_proj.weight", {inter, hidden}, 0);
    add(p + "mlp.down_proj.weight", {hidden, inter}, 1);
    add(p + "input_layernorm.weight", {hidden}, -1);
    add(p + "post_attention_layernorm.weight", {hidden}, -1);
  }
  add("model.norm.weight", {hidden}, -1);
  add("lm_head.weight", {vocab, hidden}, 0);
  return out;
}

std::vector<TensorMap> tp_layout_maps(const std::vector<ModelTensor>& model, int tp) {
  std::vector<TensorMap> out;
  for (const auto& t : model) {
    out.push_back(t.split_dim < 0 ? replicated(t.info, tp)
                                  : contiguous_split(t.info, t.split_dim, even_split_sizes(t.info.shape[t.split_dim], tp)));
  }
  return out;
}

std::vector<TensorMap> training_storage_maps(const std::vector<ModelTensor>& model, int tp, int dp, const std::string& kind) {
  const std::vector<TensorMap> layouts = tp_layout_maps(model, tp);
  // Per TP rank: the storage map of every tensor's shard.
  std::vector<std::map<int, TensorMap>> storage(model.size());
  for (int t = 0; t < tp; ++t) {
    std::vector<TensorInfo> shards;
    for (const auto& layout : layouts) shards.push_back({layout.name, layout.dtype, layout.ranks.at(t).buffer_shape});
    std::vector<TensorMap> maps;
    if (kind == "zero2_params") {
      for (const auto& s : shards) maps.push_back(replicated(s, dp));
    } else if (kind == "zero2_master") {
      maps = zero12_flat_group(shards, dp, 2);
    } else if (kind == "zero3_params") {
      for (const auto& s : shards) maps.push_back(zero3_partition(s, dp));
    } else {
      maps = zero3_flat_group(shards, dp);
    }
    for (size_t i = 0; i < maps.size(); ++i) storage[i][t] = std::move(maps[i]);
  }
  std::vector<TensorMap> out;
  for (size_t i = 0; i < layouts.size(); ++i) {
    out.push_back(nest(layouts[i], storage[i], [tp](int t, int s) { return s * tp + t; }));
  }
  return out;
}

}  // namespace tessera::affine::bench
