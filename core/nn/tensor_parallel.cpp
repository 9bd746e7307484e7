#include "core/nn/tensor_parallel.h"

#include <torch/torch.h>

#include <optional>

#include "core/error.h"
#include "core/text.h"

namespace tessera::nn {
namespace {

std::string layer_prefix(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

}  // namespace

void check_tp_size(const DecoderConfig& c, int tp) {
  auto fail = [&](const std::string& what) {
    throw ConfigError("tensor parallel size " + std::to_string(tp) + ": " + what);
  };
  if (tp < 1) fail("must be at least 1");
  if (c.num_attention_heads % tp != 0)
    fail("does not divide num_attention_heads " + std::to_string(c.num_attention_heads));
  if (c.num_key_value_heads % tp != 0 && tp % c.num_key_value_heads != 0)
    fail("num_key_value_heads " + std::to_string(c.num_key_value_heads) +
         " must be a multiple or a divisor of it (KV heads are split or replicated whole)");
  if (c.intermediate_size % tp != 0)
    fail("does not divide intermediate_size " + std::to_string(c.intermediate_size));
}

int64_t padded_vocab_size(const DecoderConfig& c, int tp) { return (c.vocab_size + tp - 1) / tp * tp; }
int64_t local_heads(const DecoderConfig& c, int tp) { return c.num_attention_heads / tp; }
int64_t local_kv_heads(const DecoderConfig& c, int tp) {
  return c.num_key_value_heads >= tp ? c.num_key_value_heads / tp : 1;
}

namespace {

// One layer's parameters, by name inside the layer ("self_attn.q_proj.weight"), in module order.
std::vector<std::pair<std::string, std::vector<int64_t>>> layer_parameter_shapes(const DecoderConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.intermediate_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"self_attn.q_proj.weight", {q, d}});
  if (c.qkv_bias) out.push_back({"self_attn.q_proj.bias", {q}});
  out.push_back({"self_attn.k_proj.weight", {kv, d}});
  if (c.qkv_bias) out.push_back({"self_attn.k_proj.bias", {kv}});
  out.push_back({"self_attn.v_proj.weight", {kv, d}});
  if (c.qkv_bias) out.push_back({"self_attn.v_proj.bias", {kv}});
  out.push_back({"self_attn.o_proj.weight", {d, q}});
  if (c.o_bias) out.push_back({"self_attn.o_proj.bias", {d}});
  if (c.qk_norm) {
    out.push_back({"self_attn.q_norm.weight", {c.head_dim}});
    out.push_back({"self_attn.k_norm.weight", {c.head_dim}});
  }
  out.push_back({"mlp.gate_proj.weight", {f, d}});
  if (c.mlp_bias) out.push_back({"mlp.gate_proj.bias", {f}});
  out.push_back({"mlp.up_proj.weight", {f, d}});
  if (c.mlp_bias) out.push_back({"mlp.up_proj.bias", {f}});
  out.push_back({"mlp.down_proj.weight", {d, f}});
  if (c.mlp_bias) out.push_back({"mlp.down_proj.bias", {d}});
  out.push_back({"input_layernorm.weight", {d}});
  out.push_back({"post_attention_layernorm.weight", {d}});
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> decoder_parameter_shapes(const DecoderConfig& c) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}});
  const auto layer = layer_parameter_shapes(c);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    for (const auto& [name, shape] : layer) out.push_back({layer_prefix(i) + name, shape});
  out.push_back({"model.norm.weight", {c.hidden_size}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}});
  return out;
}

std::optional<std::vector<int64_t>> decoder_parameter_shape(const DecoderConfig& c, const std::string& name) {
  if (name == "model.embed_tokens.weight" || (name == "lm_head.weight" && !c.tie_word_embeddings))
    return std::vector<int64_t>{c.vocab_size, c.hidden_size};
  if (name == "model.norm.weight") return std::vector<int64_t>{c.hidden_size};
  const std::string prefix = "model.layers.";
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const auto dot = name.find('.', prefix.size());
  const auto index = name.substr(prefix.size(), dot == std::string::npos ? 0 : dot - prefix.size());
  if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos ||
      (index.size() > 1 && index[0] == '0') || std::stoll(index) >= c.num_hidden_layers)
    return std::nullopt;
  for (const auto& [suffix, shape] : layer_parameter_shapes(c))
    if (name.compare(dot + 1, std::string::npos, suffix) == 0) return shape;
  return std::nullopt;
}

TpShard decoder_tp_shard(const DecoderConfig& c, const std::string& name, int rank, int tp) {
  if (!decoder_parameter_shape(c, name))
    throw Error("decoder_tp_shard: '" + name + "' is not a parameter of this " + c.model_type() + " model");
  TpShard s;
  auto split = [&](int dim, int64_t full) {
    s.dim = dim;
    s.length = s.local_length = full / tp;
    s.begin = rank * s.length;
  };
  const int64_t hd = c.head_dim;
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
    const int64_t rows = padded_vocab_size(c, tp) / tp;
    s.dim = 0;
    s.begin = rank * rows;
    s.local_length = rows;
    s.length = std::max<int64_t>(0, std::min(rows, c.vocab_size - s.begin));
  } else if (ends_with(name, "q_proj.weight") || ends_with(name, "q_proj.bias")) {
    split(0, c.q_width());
  } else if (ends_with(name, "k_proj.weight") || ends_with(name, "k_proj.bias") ||
             ends_with(name, "v_proj.weight") || ends_with(name, "v_proj.bias")) {
    s.dim = 0;
    s.length = s.local_length = local_kv_heads(c, tp) * hd;
    // KV >= tp: heads split evenly; tp > KV: rank r uses KV head r / (tp / KV), as its query heads do.
    const int64_t head = c.num_key_value_heads >= tp ? rank * local_kv_heads(c, tp)
                                                     : rank / (tp / c.num_key_value_heads);
    s.begin = head * hd;
  } else if (ends_with(name, "o_proj.weight")) {
    split(1, c.q_width());
  } else if (ends_with(name, "gate_proj.weight") || ends_with(name, "gate_proj.bias") ||
             ends_with(name, "up_proj.weight") || ends_with(name, "up_proj.bias")) {
    split(0, c.intermediate_size);
  } else if (ends_with(name, "down_proj.weight")) {
    split(1, c.intermediate_size);
  }
  return s;  // norms and row-parallel biases: replicated
}

at::Tensor cut_shard(const at::Tensor& full, const TpShard& s) {
  if (s.dim < 0) return full.clone();
  auto shape = full.sizes().vec();
  shape[s.dim] = s.local_length;
  auto local = torch::zeros(shape, full.options());
  if (s.length > 0) local.narrow(s.dim, 0, s.length).copy_(full.narrow(s.dim, s.begin, s.length));
  return local;
}

}  // namespace tessera::nn
