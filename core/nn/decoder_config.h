// DecoderConfig is the shape of one Llama / Qwen2 / Qwen3 decoder-only model, read from a Hugging
// Face `config.json`: the same keys, and where a key is absent transformers' defaults (Qwen3's head_dim
// 128, Qwen2/Qwen3's 32 KV heads, ...); the sizes (vocab, hidden, intermediate, layers, heads) are required.
//
// What the keys mean here:
//   hidden_size d, num_attention_heads H, num_key_value_heads KV (GQA: H % KV == 0), head_dim hd
//   (Qwen3 and recent Llamas and Qwen2s give it; otherwise d / H), intermediate_size of the SwiGLU MLP,
//   rms_norm_eps, rope_theta, tie_word_embeddings (lm_head shares model.embed_tokens.weight).
//   Family differences: Qwen2 has biases on q/k/v (not o), and its `attention_bias` may only say
//   so (true); Llama and Qwen3 take `attention_bias` (q/k/v and o); Qwen3 normalises q and k per
//   head (q_norm, k_norm) before RoPE.
// Keys tessera does not implement (rope_scaling, sliding windows, dropout, pretraining_tp > 1, an
// activation other than silu) are refused when set to anything but their neutral value, and so is
// any key that is neither implemented nor known to be harmless: nothing is silently ignored.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::nn {

enum class DecoderFamily { llama, qwen2, qwen3 };

struct DecoderConfig {
  DecoderFamily family = DecoderFamily::llama;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;     // q_proj, k_proj, v_proj carry a bias
  bool o_bias = false;       // o_proj carries a bias
  bool mlp_bias = false;     // gate/up/down carry a bias
  bool qk_norm = false;      // Qwen3's q_norm / k_norm
  double initializer_range = 0.02;
  std::vector<int64_t> eos_token_ids;  // may be empty
  int64_t bos_token_id = -1;           // -1: none
  std::string torch_dtype = "float32"; // as written in the config (weights may be stored so)

  const char* model_type() const;
  // q/k/v heads' widths: H * hd and KV * hd.
  int64_t q_width() const { return num_attention_heads * head_dim; }
  int64_t kv_width() const { return num_key_value_heads * head_dim; }
};

// Parses a config.json text; `file` names it in errors (tessera::ConfigError "file: key: why").
DecoderConfig parse_decoder_config(const std::string& json_text, const std::string& file);
// Reads `path`, a config.json or a directory holding one.
DecoderConfig load_decoder_config(const std::string& path);
// The config as a Hugging Face config.json (parse_decoder_config reads it back equal).
std::string decoder_config_json(const DecoderConfig& config);

// Number of parameters of a model of this config (untied lm_head counted when untied).
int64_t decoder_parameter_count(const DecoderConfig& config);

}  // namespace tessera::nn
