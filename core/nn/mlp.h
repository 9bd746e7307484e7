// Mlp is a plain multi-layer perceptron of stock LibTorch Linear layers with tanh between them:
// the model of the memory and step-time benchmarks (its size is set by two numbers, and nothing
// but matrix products and elementwise ops runs, so the data-parallel path dominates).
//
// Shapes: x [B, input] -> Linear(input, width) -> tanh -> (layers - 1) x [Linear(width, width),
// tanh] -> Linear(width, output); loss = mean squared error against a target [B, output]. The
// layers are entries of one torch::nn::Sequential ("net.fc0", ..., "net.head"), which ZeRO-3 takes.
// Example: input 256, width 4096, layers 4, output 16: 51.4 M parameters (205 MB in fp32);
// width 1024: 3.44 M (13.8 MB). Inputs and targets are seeded per (seed, step, rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace torch::nn {
class Module;
}

namespace tessera::nn {

struct MlpConfig {
  int64_t input = 256;
  int64_t width = 1024;
  int64_t layers = 4;  // hidden layers of `width`
  int64_t output = 16;
  uint64_t seed = 7;   // parameter initialisation
};

int64_t mlp_parameter_count(const MlpConfig& config);

class Mlp {
 public:
  explicit Mlp(const MlpConfig& config);
  ~Mlp();
  at::Tensor forward(const at::Tensor& x) const;
  // The loss of a batch of `batch` rows that depends only on (seed, step, rank).
  at::Tensor loss(int64_t batch, uint64_t seed, int64_t step, int64_t rank) const;
  std::shared_ptr<torch::nn::Module> module() const;
  const MlpConfig& config() const { return config_; }

 private:
  struct Impl;
  MlpConfig config_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::nn
