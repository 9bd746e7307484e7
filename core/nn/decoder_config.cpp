#include "core/nn/decoder_config.h"

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "core/error.h"

namespace tessera::nn {
namespace {

using json = nlohmann::json;

// Keys of transformers' PretrainedConfig and of the three families' configs that change nothing in
// a forward pass (bookkeeping, generation defaults, outputs of the Python API).
const std::set<std::string>& harmless_keys() {
  static const std::set<std::string> keys = {
      "architectures", "transformers_version", "torch_dtype", "use_cache", "pad_token_id", "_name_or_path",
      "return_dict", "output_hidden_states", "output_attentions", "torchscript", "use_bfloat16",
      "tie_encoder_decoder", "is_encoder_decoder", "is_decoder", "add_cross_attention", "chunk_size_feed_forward",
      "id2label", "label2id", "problem_type", "tokenizer_class", "prefix", "task_specific_params",
      "finetuning_task", "cross_attention_hidden_size", "decoder_start_token_id", "sep_token_id",
      "pruned_heads", "bad_words_ids", "begin_suppress_tokens", "suppress_tokens", "forced_bos_token_id",
      "forced_eos_token_id", "remove_invalid_values", "exponential_decay_length_penalty", "max_length",
      "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups", "diversity_penalty",
      "temperature", "top_k", "top_p", "typical_p", "repetition_penalty", "length_penalty",
      "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "num_return_sequences", "output_scores",
      "return_dict_in_generate", "tf_legacy_loss",
      "max_window_layers",  // only read by transformers when use_sliding_window is true (refused)
      "initializer_range"};
  return keys;
}

struct Reader {
  const json& root;
  const std::string& file;
  std::set<std::string> used;

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw ConfigError(file + ": " + key + ": " + why);
  }
  bool has(const std::string& key) const { return root.contains(key) && !root.at(key).is_null(); }
  int64_t integer(const std::string& key, int64_t fallback, bool required = false) {
    used.insert(key);
    if (!has(key)) {
      if (required) fail(key, "missing (required)");
      return fallback;
    }
    const auto& v = root.at(key);
    if (!v.is_number_integer()) fail(key, "expected an integer, got " + v.dump());
    const auto value = v.get<int64_t>();
    if (value < 0) fail(key, "must not be negative, got " + std::to_string(value));
    return value;
  }
  double number(const std::string& key, double fallback) {
    used.insert(key);
    if (!has(key)) return fallback;
    const auto& v = root.at(key);
    if (!v.is_number()) fail(key, "expected a number, got " + v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& key, bool fallback) {
    used.insert(key);
    if (!has(key)) return fallback;
    const auto& v = root.at(key);
    if (!v.is_boolean()) fail(key, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string string(const std::string& key, const std::string& fallback) {
    used.insert(key);
    if (!has(key)) return fallback;
    const auto& v = root.at(key);
    if (!v.is_string()) fail(key, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  // A key tessera does not implement: accepted only at the value that means "off".
  void neutral(const std::string& key, const json& off, const std::string& why) {
    used.insert(key);
    if (!root.contains(key) || root.at(key).is_null() || root.at(key) == off) return;
    fail(key, root.at(key).dump() + " is not supported (" + why + ")");
  }
};

}  // namespace

const char* DecoderConfig::model_type() const {
  switch (family) {
    case DecoderFamily::llama: return "llama";
    case DecoderFamily::qwen2: return "qwen2";
    case DecoderFamily::qwen3: return "qwen3";
  }
  return "?";
}

DecoderConfig parse_decoder_config(const std::string& json_text, const std::string& file) {
  json root;
  try {
    root = json::parse(json_text);
  } catch (const json::exception& e) {
    throw ConfigError(file + ": not valid JSON: " + e.what());
  }
  if (!root.is_object()) throw ConfigError(file + ": a config.json must be a JSON object");
  Reader r{root, file, {}};
  DecoderConfig c;
  const auto type = r.string("model_type", "");
  if (type == "llama") c.family = DecoderFamily::llama;
  else if (type == "qwen2") c.family = DecoderFamily::qwen2;
  else if (type == "qwen3") c.family = DecoderFamily::qwen3;
  else r.fail("model_type", "'" + type + "' is not one of llama, qwen2, qwen3");

  c.vocab_size = r.integer("vocab_size", 0, true);
  c.hidden_size = r.integer("hidden_size", 0, true);
  c.intermediate_size = r.integer("intermediate_size", 0, true);
  c.num_hidden_layers = r.integer("num_hidden_layers", 0, true);
  c.num_attention_heads = r.integer("num_attention_heads", 0, true);
  // transformers' defaults: LlamaConfig takes num_attention_heads, Qwen2Config / Qwen3Config 32.
  c.num_key_value_heads = r.integer("num_key_value_heads", c.family == DecoderFamily::llama ? c.num_attention_heads : 32);
  c.max_position_embeddings = r.integer("max_position_embeddings", c.family == DecoderFamily::llama ? 2048 : 32768);
  c.rms_norm_eps = r.number("rms_norm_eps", 1e-6);
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  c.initializer_range = r.number("initializer_range", 0.02);
  // Recent transformers write "dtype" where older ones wrote "torch_dtype".
  c.torch_dtype = r.string("torch_dtype", r.string("dtype", "float32"));
  c.bos_token_id = r.has("bos_token_id") ? r.integer("bos_token_id", -1) : -1;
  r.used.insert("bos_token_id");
  r.used.insert("eos_token_id");
  if (r.has("eos_token_id")) {
    const auto& eos = root.at("eos_token_id");
    auto add = [&](const json& v) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) r.fail("eos_token_id", "expected token ids, got " + eos.dump());
      c.eos_token_ids.push_back(v.get<int64_t>());
    };
    if (eos.is_array()) for (const auto& v : eos) add(v);
    else add(eos);
  }
  // head_dim: Qwen3 always carries it; Llama has it since transformers 4.45; Qwen2 derives it.
  const int64_t derived = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
  // Qwen3Config defaults to 128 whatever the width.
  c.head_dim = r.integer("head_dim", c.family == DecoderFamily::qwen3 ? 128 : derived);
  if (c.family == DecoderFamily::qwen2) {
    // Qwen2Attention: bias on q/k/v, none on o, whatever attention_bias says (transformers does not
    // read it for Qwen2). Some exported configs carry it: true states the truth; false would ask
    // for a model without the biases the checkpoint holds.
    c.qkv_bias = true;
    if (!r.boolean("attention_bias", true)) {
      r.fail("attention_bias", "false, but Qwen2's q/k/v projections always have a bias (the checkpoint holds "
                               "q_proj.bias, k_proj.bias, v_proj.bias); set true or remove the key");
    }
  } else {
    c.qkv_bias = c.o_bias = r.boolean("attention_bias", false);
  }
  c.mlp_bias = c.family == DecoderFamily::llama ? r.boolean("mlp_bias", false) : false;
  c.qk_norm = c.family == DecoderFamily::qwen3;

  const auto act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail("hidden_act", "'" + act + "' is not supported (SwiGLU with silu only)");
  r.neutral("rope_scaling", json(), "RoPE scaling is not implemented; remove it or set null");
  r.neutral("use_sliding_window", false, "sliding-window attention is not implemented");
  if (c.family != DecoderFamily::llama) {
    // Qwen configs carry a window size that only matters with use_sliding_window (refused above).
    r.used.insert("sliding_window");
  } else {
    r.neutral("sliding_window", json(), "sliding-window attention is not implemented");
  }
  r.neutral("attention_dropout", 0.0, "dropout in attention is not implemented");
  r.neutral("pretraining_tp", 1, "Llama's pretraining_tp slicing is not implemented");
  r.neutral("rope_type", "default", "only the default RoPE is implemented");
  r.used.insert("layer_types");
  if (r.has("layer_types")) {
    const auto& types = root.at("layer_types");
    if (!types.is_array()) r.fail("layer_types", "expected a list");
    for (const auto& t : types)
      if (t != "full_attention") r.fail("layer_types", t.dump() + " is not supported (full attention only)");
  }

  std::vector<std::string> unknown;
  for (const auto& item : root.items())
    if (!r.used.count(item.key()) && !harmless_keys().count(item.key())) unknown.push_back(item.key());
  if (!unknown.empty()) {
    std::string list;
    for (const auto& k : unknown) list += (list.empty() ? "" : ", ") + k;
    throw ConfigError(file + ": keys tessera does not implement: " + list +
                      " (refused rather than ignored; remove them if they are neutral)");
  }

  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) r.fail(key, "must be positive, got " + std::to_string(v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("intermediate_size", c.intermediate_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("num_key_value_heads", c.num_key_value_heads);
  positive("head_dim", c.head_dim);
  positive("max_position_embeddings", c.max_position_embeddings);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    r.fail("num_key_value_heads", std::to_string(c.num_key_value_heads) + " does not divide num_attention_heads " +
                                      std::to_string(c.num_attention_heads));
  if (c.head_dim % 2 != 0) r.fail("head_dim", "must be even for RoPE, got " + std::to_string(c.head_dim));
  if (!(c.rms_norm_eps > 0)) r.fail("rms_norm_eps", "must be positive");
  if (!(c.rope_theta > 0)) r.fail("rope_theta", "must be positive");
  for (auto id : c.eos_token_ids)
    if (id >= c.vocab_size) r.fail("eos_token_id", std::to_string(id) + " is outside the vocabulary");
  return c;
}

DecoderConfig load_decoder_config(const std::string& path) {
  std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) p /= "config.json";
  // Only a regular file: opening a FIFO would block until a writer comes.
  std::error_code error;
  const auto status = std::filesystem::status(p, error);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw ConfigError(p.string() + ": not a regular file; the model config is read from a regular file only");
  std::ifstream in(p, std::ios::binary);
  if (!in) throw ConfigError(p.string() + ": cannot open the model config");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_decoder_config(text.str(), p.string());
}

std::string decoder_config_json(const DecoderConfig& c) {
  static const char* architectures[] = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"};
  json j;
  j["architectures"] = {architectures[int(c.family)]};
  j["model_type"] = c.model_type();
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;  // always explicit (Qwen3's default is 128)
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.family != DecoderFamily::qwen2) j["attention_bias"] = c.qkv_bias;
  if (c.family == DecoderFamily::llama) j["mlp_bias"] = c.mlp_bias;
  j["hidden_act"] = "silu";
  j["initializer_range"] = c.initializer_range;
  j["torch_dtype"] = c.torch_dtype;
  if (c.bos_token_id >= 0) j["bos_token_id"] = c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  else if (!c.eos_token_ids.empty()) j["eos_token_id"] = c.eos_token_ids;
  return j.dump(2) + "\n";
}

int64_t decoder_parameter_count(const DecoderConfig& c) {
  const int64_t d = c.hidden_size, q = c.q_width(), kv = c.kv_width(), f = c.intermediate_size;
  int64_t layer = 2 * d;                                   // input / post-attention norms
  layer += q * d + 2 * kv * d + d * q;                     // q, k, v, o
  if (c.qkv_bias) layer += q + 2 * kv;
  if (c.o_bias) layer += d;
  if (c.qk_norm) layer += 2 * c.head_dim;
  layer += 3 * d * f + (c.mlp_bias ? 2 * f + d : 0);       // gate, up, down
  return c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2) + c.num_hidden_layers * layer + d;
}

}  // namespace tessera::nn
