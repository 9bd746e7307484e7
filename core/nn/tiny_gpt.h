// TinyGpt is a small decoder-only byte-level language model (GPT-2 shaped) built from stock
// LibTorch modules: the model the examples, tests and benchmarks train.
//
// Shape of a forward pass (B sequences of T tokens, d = d_model, H heads of d / H):
//   tokens [B, T] int64 -> wte [B, T, d] + wpe [T, d] -> n_layer x Block -> ln_f -> lm_head [B, T, vocab]
//   Block: x + attn(ln_1(x)), then x + mlp(ln_2(x)); attn uses c_attn [d -> 3d] and c_proj [d -> d]
//   with a causal mask; mlp uses c_fc [d -> 4d], GELU, c_proj [4d -> d].
// Parameter names follow GPT-2 ("h.0.attn.c_attn.weight"), so tensor-parallel presets and
// checkpoints can name them. Default config: 3.31 M parameters.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace torch::nn {
class Module;
}

namespace tessera::nn {

struct GptConfig {
  int64_t vocab_size = 256;  // bytes
  int64_t context = 128;
  int64_t d_model = 256;
  int64_t n_layer = 4;
  int64_t n_head = 4;
  // Biases in the Linear layers (nanoGPT's `bias`). Off by default: besides saving parameters, the
  // key bias has a mathematically zero gradient (softmax ignores a shift shared by all keys), so
  // Adam turns its rounding noise into full-size updates that differ with summation order.
  bool bias = false;
  // Activation checkpointing of every block (activation_checkpoint.h): its activations are
  // recomputed in backward instead of kept. Same results, bitwise.
  bool checkpoint_blocks = false;
  uint64_t seed = 1234;      // parameter initialisation
};

// Number of parameters of a config, from the shapes above (the tests check it against the model).
int64_t gpt_parameter_count(const GptConfig& config);

class TinyGpt {
 public:
  explicit TinyGpt(const GptConfig& config);
  ~TinyGpt();

  // Logits [B, T, vocab] for tokens [B, T] (T <= context).
  at::Tensor forward(const at::Tensor& tokens) const;
  // Mean cross-entropy of forward(tokens) against targets [B, T].
  at::Tensor loss(const at::Tensor& tokens, const at::Tensor& targets) const;

  // The module, for named_parameters(), train()/eval() and the engine.
  std::shared_ptr<torch::nn::Module> module() const;
  const GptConfig& config() const { return config_; }

 private:
  struct Impl;
  GptConfig config_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::nn
