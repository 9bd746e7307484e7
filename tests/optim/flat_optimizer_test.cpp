// FlatOptimizer on ZeRO-style partitions of a flat buffer against LibTorch's own optimizers on
// the whole parameters: after 12 steps every parameter must be bitwise equal.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>

#include "core/error.h"
#include "core/optim/flat_optimizer.h"

using tessera::optim::FlatOptimizer;
using tessera::optim::OptimizerKind;
using tessera::optim::OptimizerOptions;
using tessera::optim::make_flat_optimizer;

namespace {

// Parameter shapes with 35 + 13 + 24 + 1 = 73 elements: with 3 ranks the flat buffer pads to 75,
// partitions of 25 elements, so tensor 0 straddles ranks 0/1 and tensor 2 straddles ranks 1/2.
const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {13}, {3, 4, 2}, {1}};

using TorchFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// Runs `steps` steps of LibTorch's optimizer on whole parameters and of FlatOptimizer on
// `world` partitions of the padded flat buffer, with the same gradients; compares bitwise.
void expect_same_as_torch(const OptimizerOptions& options, const TorchFactory& make_torch, int world,
                          int steps = 12) {
  torch::manual_seed(1234);
  std::vector<torch::Tensor> reference;
  int64_t total = 0;
  for (const auto& shape : kShapes) {
    reference.push_back(torch::randn(shape));
    total += reference.back().numel();
  }
  const int64_t padded = (total + world - 1) / world * world, part = padded / world;
  auto flat = torch::zeros({padded});
  auto flat_grad = torch::zeros({padded});
  {
    int64_t offset = 0;
    for (auto& p : reference) {
      flat.narrow(0, offset, p.numel()).copy_(p.reshape(-1));
      offset += p.numel();
    }
  }
  for (auto& p : reference) p.set_requires_grad(true);
  auto torch_opt = make_torch(reference);
  std::vector<std::unique_ptr<FlatOptimizer>> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(make_flat_optimizer(options));

  for (int step = 0; step < steps; ++step) {
    int64_t offset = 0;
    for (auto& p : reference) {
      auto g = torch::randn(p.sizes()) * (step % 3 == 0 ? 10.0 : 0.1);
      p.mutable_grad() = g;
      flat_grad.narrow(0, offset, p.numel()).copy_(g.reshape(-1));
      offset += p.numel();
    }
    torch_opt->step();
    for (int r = 0; r < world; ++r)
      ranks[r]->step(flat.narrow(0, r * part, part), flat_grad.narrow(0, r * part, part),
                     ranks[r]->default_hyperparameters());
  }
  int64_t offset = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    auto mine = flat.narrow(0, offset, reference[i].numel()).reshape(reference[i].sizes());
    INFO("parameter " << i << " max |diff| " << (mine - reference[i].detach()).abs().max().item<float>());
    CHECK(torch::equal(mine, reference[i].detach()));
    offset += reference[i].numel();
  }
  // Padding never moves: its gradient is zero and so are its states.
  if (padded > total && options.weight_decay == 0 && options.kind != OptimizerKind::Lion)
    CHECK(flat.narrow(0, total, padded - total).abs().max().item<float>() == 0.0f);
}

}  // namespace

TEST_CASE("Adam on partitions equals torch::optim::Adam bitwise", "[optim]") {
  for (int world : {1, 2, 3, 4}) {
    for (double wd : {0.0, 0.01}) {
      for (bool amsgrad : {false, true}) {
        OptimizerOptions o;
        o.kind = OptimizerKind::Adam;
        o.lr = 1e-2, o.weight_decay = wd, o.amsgrad = amsgrad;
        INFO("world " << world << " weight_decay " << wd << " amsgrad " << amsgrad);
        expect_same_as_torch(o, [&](std::vector<torch::Tensor> ps) {
          return std::make_unique<torch::optim::Adam>(
              ps, torch::optim::AdamOptions(1e-2).weight_decay(wd).amsgrad(amsgrad));
        }, world);
      }
    }
  }
}

TEST_CASE("AdamW on partitions equals torch::optim::AdamW bitwise", "[optim]") {
  for (int world : {1, 2, 3}) {
    OptimizerOptions o;
    o.kind = OptimizerKind::AdamW;
    o.lr = 3e-3, o.beta1 = 0.8, o.beta2 = 0.95, o.eps = 1e-6, o.weight_decay = 0.1;
    INFO("world " << world);
    expect_same_as_torch(o, [](std::vector<torch::Tensor> ps) {
      return std::make_unique<torch::optim::AdamW>(
          ps, torch::optim::AdamWOptions(3e-3).betas({0.8, 0.95}).eps(1e-6).weight_decay(0.1));
    }, world);
  }
}

TEST_CASE("SGD on partitions equals torch::optim::SGD bitwise", "[optim]") {
  struct Variant { double momentum, dampening, wd; bool nesterov; };
  for (auto v : {Variant{0, 0, 0, false}, Variant{0.9, 0, 0, false}, Variant{0.9, 0.1, 1e-3, false},
                 Variant{0.9, 0, 1e-3, true}}) {
    OptimizerOptions o;
    o.kind = OptimizerKind::SGD;
    o.lr = 0.05, o.momentum = v.momentum, o.dampening = v.dampening, o.weight_decay = v.wd, o.nesterov = v.nesterov;
    INFO("momentum " << v.momentum << " dampening " << v.dampening << " nesterov " << v.nesterov);
    expect_same_as_torch(o, [&](std::vector<torch::Tensor> ps) {
      return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.05)
                                                         .momentum(v.momentum)
                                                         .dampening(v.dampening)
                                                         .weight_decay(v.wd)
                                                         .nesterov(v.nesterov));
    }, 3);
  }
}

TEST_CASE("Adagrad on partitions equals torch::optim::Adagrad bitwise", "[optim]") {
  OptimizerOptions o;
  o.kind = OptimizerKind::Adagrad;
  o.lr = 0.1, o.lr_decay = 0.01, o.weight_decay = 1e-3, o.initial_accumulator_value = 0.1, o.eps = 1e-10;
  expect_same_as_torch(o, [](std::vector<torch::Tensor> ps) {
    return std::make_unique<torch::optim::Adagrad>(
        ps, torch::optim::AdagradOptions(0.1).lr_decay(0.01).weight_decay(1e-3).initial_accumulator_value(0.1).eps(1e-10));
  }, 2);
}

TEST_CASE("Lion follows its closed form and is partition-invariant", "[optim]") {
  // One step from m = 0: update = sign((1 - b1) g) = sign(g); p' = p (1 - lr wd) - lr sign(g);
  // m' = (1 - b2) g. Computed here in double, compared within float rounding.
  OptimizerOptions o = tessera::optim::default_options(OptimizerKind::Lion);
  o.lr = 0.01, o.weight_decay = 0.1;
  auto opt = make_flat_optimizer(o);
  auto p = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f});
  auto g = torch::tensor({0.3f, -0.7f, 0.0f, -1e-3f});
  auto p0 = p.clone();
  opt->step(p, g, opt->default_hyperparameters());
  for (int i = 0; i < 4; ++i) {
    double gi = g[i].item<double>(), sign = gi > 0 ? 1 : (gi < 0 ? -1 : 0);
    double expected = p0[i].item<double>() * (1 - 0.01 * 0.1) - 0.01 * sign;
    CHECK(p[i].item<double>() == Approx(expected).epsilon(1e-6));
    CHECK(opt->states()[0][i].item<double>() == Approx((1 - 0.99) * gi).epsilon(1e-6));
  }
  // Partition invariance: one optimizer over the whole buffer vs three over slices.
  o.weight_decay = 0.0;
  auto whole = make_flat_optimizer(o);
  torch::manual_seed(7);
  auto a = torch::randn({101}), b = a.clone();
  std::vector<std::unique_ptr<FlatOptimizer>> parts;
  for (int r = 0; r < 3; ++r) parts.push_back(make_flat_optimizer(o));
  const int64_t bounds[] = {0, 40, 41, 101};
  for (int step = 0; step < 5; ++step) {
    auto grad = torch::randn({101});
    whole->step(a, grad, whole->default_hyperparameters());
    for (int r = 0; r < 3; ++r)
      parts[r]->step(b.narrow(0, bounds[r], bounds[r + 1] - bounds[r]),
                     grad.narrow(0, bounds[r], bounds[r + 1] - bounds[r]), parts[r]->default_hyperparameters());
  }
  CHECK(torch::equal(a, b));
}

TEST_CASE("FlatOptimizer refuses mismatched inputs and bad options before changing anything", "[optim]") {
  auto opt = make_flat_optimizer(tessera::optim::default_options(OptimizerKind::Adam));
  auto p = torch::ones({8}), g = torch::ones({8});
  opt->step(p, g, opt->default_hyperparameters());
  auto before = p.clone();
  auto state_before = opt->states()[0].clone();
  CHECK_THROWS_WITH(opt->step(torch::ones({9}), torch::ones({9}), opt->default_hyperparameters()),
                    Catch::Contains("9 elements") && Catch::Contains("8 elements"));
  CHECK_THROWS_WITH(opt->step(p, torch::ones({7}), opt->default_hyperparameters()),
                    Catch::Contains("does not match"));
  CHECK(torch::equal(p, before));
  CHECK(torch::equal(opt->states()[0], state_before));
  CHECK(opt->steps_taken() == 1);

  OptimizerOptions bad;
  bad.kind = OptimizerKind::Adam;
  bad.beta2 = 1.0;
  CHECK_THROWS_AS(make_flat_optimizer(bad), tessera::ConfigError);
  CHECK_THROWS_WITH(make_flat_optimizer(bad), Catch::Contains("optimizer.params.betas[1]"));
  bad = OptimizerOptions{};
  bad.kind = OptimizerKind::SGD;
  bad.nesterov = true;
  CHECK_THROWS_WITH(make_flat_optimizer(bad), Catch::Contains("optimizer.params.dampening"));
  CHECK_THROWS_WITH(tessera::optim::parse_optimizer_kind("Adamm"), Catch::Contains("expected one of"));
}

TEST_CASE("load_states restores a run bitwise", "[optim]") {
  // 3 steps, save states; a fresh optimizer loaded with them continues exactly like the original.
  auto o = tessera::optim::default_options(OptimizerKind::AdamW);
  auto original = make_flat_optimizer(o);
  torch::manual_seed(3);
  auto p = torch::randn({50});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({50}));
  for (int i = 0; i < 3; ++i) original->step(p, grads[i], original->default_hyperparameters());
  auto resumed = make_flat_optimizer(o);
  std::vector<torch::Tensor> saved;
  for (auto& s : original->states()) saved.push_back(s.clone());
  resumed->load_states(saved, original->steps_taken());
  auto q = p.clone();
  for (int i = 3; i < 6; ++i) {
    original->step(p, grads[i], original->default_hyperparameters());
    resumed->step(q, grads[i], resumed->default_hyperparameters());
  }
  CHECK(torch::equal(p, q));
  CHECK_THROWS_WITH(resumed->load_states({saved[0]}, 1), Catch::Contains("expected 2 states"));
}
