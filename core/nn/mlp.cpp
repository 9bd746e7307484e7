#include "core/nn/mlp.h"

#include <torch/torch.h>

namespace tessera::nn {

int64_t mlp_parameter_count(const MlpConfig& c) {
  return c.input * c.width + c.width + (c.layers - 1) * (c.width * c.width + c.width) + c.width * c.output + c.output;
}

// One stock Sequential: ZeRO-3 brackets its entries itself (core/zero/sequential_units.h), so the
// same model runs at every stage.
struct Mlp::Impl : torch::nn::Module {
  explicit Impl(const MlpConfig& c) {
    torch::manual_seed(c.seed);
    net = register_module("net", torch::nn::Sequential());
    for (int64_t i = 0; i < c.layers; ++i) {
      net->push_back("fc" + std::to_string(i), torch::nn::Linear(i == 0 ? c.input : c.width, c.width));
      net->push_back("tanh" + std::to_string(i), torch::nn::Functional(torch::tanh));
    }
    net->push_back("head", torch::nn::Linear(c.width, c.output));
  }
  torch::nn::Sequential net{nullptr};
};

Mlp::Mlp(const MlpConfig& config) : config_(config), impl_(std::make_shared<Impl>(config)) {}
Mlp::~Mlp() = default;

at::Tensor Mlp::forward(const at::Tensor& x) const { return impl_->net->forward(x); }

at::Tensor Mlp::loss(int64_t batch, uint64_t seed, int64_t step, int64_t rank) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003 + uint64_t(step) * 101 + uint64_t(rank));
  auto x = at::randn({batch, config_.input}, gen);
  auto y = at::randn({batch, config_.output}, gen);
  return torch::mse_loss(forward(x), y);
}

std::shared_ptr<torch::nn::Module> Mlp::module() const { return impl_; }

}  // namespace tessera::nn
