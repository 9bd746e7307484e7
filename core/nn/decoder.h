// DecoderLm is a Llama / Qwen2 / Qwen3 causal language model built from stock LibTorch modules,
// with Hugging Face parameter names, optionally one rank's shard of a tensor-parallel group.
//
// Forward (B sequences of T new tokens, d = hidden, H heads of hd, KV key/value heads):
//   ids [B, T] -> embed_tokens -> L x layer -> norm -> lm_head -> logits [B, T, vocab] (fp32)
//   layer: h = x + o_proj(attn(rope(q_norm?(q_proj(rms(x)))), rope(k_norm?(k_proj(rms(x)))), v_proj(rms(x))))
//          out = h + down_proj(silu(gate_proj(rms(h))) * up_proj(rms(h)))
//   attention is causal and skips keys whose attention_mask is 0 (left padding); query head j uses
//   KV head j / (H / KV); scores scaled by 1 / sqrt(hd); softmax in fp32.
// Each layer is its own module ("model.layers.3"), so ZeRO-3's unit holders can bracket it; the
// training engine sees an ordinary torch::nn::Module (module()). With a TensorParallel of size > 1
// the parameters are this rank's shards (tensor_parallel.h) under the same names.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/decoder_config.h"
#include "core/nn/tensor_parallel.h"

namespace torch::nn {
class Module;
}

namespace tessera::io {
class WeightDirectory;
}

namespace tessera::nn {

// Keys and values of every layer for `batch` sequences, `capacity` slots each; slots [0, length)
// are filled. One cache serves one batch; forward() appends the new tokens and advances length.
struct KvCache {
  std::vector<at::Tensor> keys, values;  // per layer [batch, local KV heads, capacity, hd]
  int64_t length = 0;
  int64_t capacity = 0;
};

struct DecoderInputs {
  // [B, T]: each token's RoPE position. Undefined: cache length + 0..T-1.
  at::Tensor position_ids;
  // [B, S] over every key slot (cached + new), 1 = a real token, 0 = padding. Undefined: all 1.
  at::Tensor attention_mask;
  // Appends to and attends over this cache when given.
  KvCache* cache = nullptr;
  // Only the last position's logits ([B, 1, vocab]): what generation needs.
  bool last_only = false;
};

struct DecoderOptions {
  TensorParallel tp;                      // default: one rank, unsharded
  at::ScalarType dtype = at::kFloat;      // parameters and activations
  uint64_t seed = 1234;                   // random initialisation (N(0, init_std), norms 1, biases 0)
  double init_std = -1;                   // < 0: the config's initializer_range
  // false: parameters start at zero, for a model whose weights are loaded or synced next (no
  // whole-tensor draw on every rank at start-up).
  bool random_init = true;
};

// Copies share one module (like torch::nn's module holders): load_pretrained returns by value.
class DecoderLm {
 public:
  // A randomly initialised model. Every weight is drawn whole from a generator seeded by (seed,
  // name) and then cut, so any TP size holds shards of the same model.
  explicit DecoderLm(const DecoderConfig& config, DecoderOptions options = {});
  ~DecoderLm();

  // Logits [B, T, vocab] in fp32 (gathered over TP ranks: every rank gets all of them).
  at::Tensor forward(const at::Tensor& input_ids, const DecoderInputs& inputs = {}) const;
  // Mean cross-entropy of forward(tokens) against targets [B, T].
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) const;

  // A cache for `batch` sequences of up to `capacity` tokens (capacity <= max_position_embeddings
  // is not required: positions, not slots, are bounded by the config).
  KvCache new_cache(int64_t batch, int64_t capacity) const;

  // Loads this rank's shards from a Hugging Face weight directory. Checked before anything is
  // written: every parameter present with its full shape and a float dtype (F32/BF16/F16,
  // converted), no tensor the model does not have (a tied model accepts an lm_head.weight equal to
  // the embedding). A read that fails after the checks (the file changed meanwhile) leaves the
  // parameters partly written: the caller must treat the model as unusable then.
  void load(const io::WeightDirectory& weights);
  // load()'s checks alone: nothing written (only a tied lm_head.weight is read, to compare).
  void check_weights(const io::WeightDirectory& weights) const;
  // Writes config.json and the weights (TP size 1 only) as a Hugging Face directory.
  void save_pretrained(const std::string& dir, uint64_t max_shard_bytes = 0) const;

  std::shared_ptr<torch::nn::Module> module() const;
  const DecoderConfig& config() const { return config_; }
  const TensorParallel& tp() const { return options_.tp; }
  at::ScalarType dtype() const { return options_.dtype; }

 private:
  struct Impl;
  DecoderConfig config_;
  DecoderOptions options_;
  std::shared_ptr<Impl> impl_;
};

// config.json + weights of `dir` (single or sharded safetensors), as this rank's shard. The
// weights' headers are checked against the config (check_decoder_weights) before the model is
// allocated.
DecoderLm load_pretrained(const std::string& dir, DecoderOptions options = {});

// DecoderLm::load's checks from the safetensors headers and the config alone, so they can run
// before a model is allocated: every parameter present with the config's shape (the error names
// the tensor and both shapes) and a float dtype, no tensor the model lacks. Reads no tensor but a
// tied lm_head.weight and the embedding, once their shapes are known to match.
void check_decoder_weights(const DecoderConfig& config, const io::WeightDirectory& weights);

}  // namespace tessera::nn
