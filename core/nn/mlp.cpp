#include "core/nn/mlp.h"

#include <torch/torch.h>

namespace tessera::nn {

int64_t mlp_parameter_count(const MlpConfig& c) {
  return c.input * c.width + c.width + (c.layers - 1) * (c.width * c.width + c.width) + c.width * c.output + c.output;
}

struct Mlp::Impl : torch::nn::Module {
  explicit Impl(const MlpConfig& c) {
    torch::manual_seed(c.seed);
    for (int64_t i = 0; i < c.layers; ++i)
      hidden.push_back(register_module("fc" + std::to_string(i), torch::nn::Linear(i == 0 ? c.input : c.width, c.width)));
    head = register_module("head", torch::nn::Linear(c.width, c.output));
  }
  std::vector<torch::nn::Linear> hidden;
  torch::nn::Linear head{nullptr};
};

Mlp::Mlp(const MlpConfig& config) : config_(config), impl_(std::make_shared<Impl>(config)) {}
Mlp::~Mlp() = default;

at::Tensor Mlp::forward(const at::Tensor& x) const {
  auto h = x;
  for (auto& layer : impl_->hidden) h = torch::tanh(layer(h));
  return impl_->head(h);
}

at::Tensor Mlp::loss(int64_t batch, uint64_t seed, int64_t step, int64_t rank) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + uint64_t(step) * 101 + uint64_t(rank));
  auto x = at::randn({batch, config_.input}, gen);
  auto y = at::randn({batch, config_.output}, gen);
  return torch::mse_loss(forward(x), y);
}

std::shared_ptr<torch::nn::Module> Mlp::module() const { return impl_; }

}  // namespace tessera::nn
