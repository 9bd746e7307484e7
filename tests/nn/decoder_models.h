// The tests' three small decoder configurations, one per family, written as Hugging Face
// config.json text (so parsing is exercised too). Chosen to cover: GQA with KV < heads, KV heads
// replicated at TP 4 (Qwen2: one KV head), an explicit head_dim != hidden / heads (Llama, Qwen3),
// tied (Qwen2) and untied embeddings, Qwen2's q/k/v biases, Qwen3's q/k norms, and vocabularies
// that TP 2 and 4 must pad; Llama carries every bias (attention_bias, mlp_bias: the row-parallel
// o/down biases, added once after the sum).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>

#include "core/nn/decoder_config.h"

namespace tessera::nn::testing {

inline const std::vector<std::pair<std::string, std::string>>& family_configs() {
  static const std::vector<std::pair<std::string, std::string>> configs = {
      {"llama", R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97,
        "hidden_size": 48, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": false, "attention_bias": true, "mlp_bias": true,
        "hidden_act": "silu", "rope_scaling": null, "pretraining_tp": 1, "attention_dropout": 0.0,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32", "use_cache": true})"},
      {"qwen2", R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 101,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 1, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": true, "hidden_act": "silu",
        "use_sliding_window": false, "sliding_window": 4096, "max_window_layers": 21,
        "attention_dropout": 0.0, "eos_token_id": 2, "torch_dtype": "bfloat16"})"},
      {"qwen3", R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 96,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 12, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": false, "attention_bias": false,
        "hidden_act": "silu", "rope_scaling": null, "use_sliding_window": false, "sliding_window": null,
        "eos_token_id": [2, 5], "torch_dtype": "bfloat16"})"},
  };
  return configs;
}

// Norm weights 1 + 0.2 N(0,1) and biases 0.2 N(0,1) (a fresh model has ones and zeros, which would
// hide a bias on the wrong projection or two swapped norms from any comparison).
inline void randomize_norms_and_biases(const std::shared_ptr<torch::nn::Module>& module, uint64_t seed) {
  at::NoGradGuard no_grad;
  auto generator = at::detail::createCPUGenerator(seed);
  for (auto& item : module->named_parameters()) {
    const auto& name = item.key();
    auto& p = item.value();
    const bool norm = name.size() > 11 && name.compare(name.size() - 11, 11, "norm.weight") == 0;
    const bool bias = name.size() > 5 && name.compare(name.size() - 5, 5, ".bias") == 0;
    if (!norm && !bias) continue;
    auto noise = at::empty(p.sizes(), at::kFloat).normal_(0.0, 0.2, generator).to(p.scalar_type());
    p.copy_(norm ? noise + 1 : noise);
  }
}

inline DecoderConfig family_config(const std::string& family) {
  for (const auto& [name, text] : family_configs())
    if (name == family) return parse_decoder_config(text, family + "/config.json");
  throw std::runtime_error("no test config " + family);
}

}  // namespace tessera::nn::testing

// The exception's type and its message (Catch2 2.x matches one or the other).
#define TESSERA_CHECK_THROWS(expr, Type, matcher) \
  do {                                            \
    CHECK_THROWS_AS(expr, Type);                  \
    CHECK_THROWS_WITH(expr, matcher);             \
  } while (0)
