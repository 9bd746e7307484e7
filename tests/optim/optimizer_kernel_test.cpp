// OptimizerKernel on ZeRO-style partitions of a flat buffer, cut further into sub-groups, against
// LibTorch's own optimizers on the whole parameters: after 12 steps every parameter must be
// bitwise equal. The workspace is reused: nothing is allocated after the first update.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <functional>
#include <memory>

#include "core/error.h"
#include "core/optim/optimizer_kernel.h"

using tessera::optim::OptimizerKernel;
using tessera::optim::OptimizerKind;
using tessera::optim::OptimizerOptions;
using tessera::optim::Workspace;
using tessera::optim::make_optimizer_kernel;

namespace {

// Parameter shapes with 35 + 13 + 24 + 1 = 73 elements: with 3 ranks the flat buffer pads to 75,
// partitions of 25 elements, so tensor 0 straddles ranks 0/1 and tensor 2 straddles ranks 1/2.
const std::vector<std::vector<int64_t>> kShapes = {{7, 5}, {13}, {3, 4, 2}, {1}};

using TorchFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

// One run of elements with its own states, as a state store holds a sub-group.
struct Run {
  torch::Tensor param, grad;
  std::vector<torch::Tensor> states;
};

// Runs `steps` steps of LibTorch's optimizer on whole parameters and of the kernel on `world`
// partitions of the padded flat buffer, each cut into sub-groups of `sub_group` elements, with
// the same gradients; compares bitwise.
void expect_same_as_torch(const OptimizerOptions& options, const TorchFactory& make_torch, int world,
                          int64_t sub_group = 1 << 30, int steps = 12) {
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
  auto kernel = make_optimizer_kernel(options);
  std::vector<Run> runs;
  for (int r = 0; r < world; ++r)
    for (int64_t b = 0; b < part; b += sub_group) {
      const int64_t n = std::min(sub_group, part - b);
      Run run{flat.narrow(0, r * part + b, n), flat_grad.narrow(0, r * part + b, n), {}};
      run.states = kernel->initial_states(run.param);
      runs.push_back(run);
    }
  Workspace workspace;
  int64_t allocations_after_first = -1;
  for (int step = 0; step < steps; ++step) {
    int64_t offset = 0;
    for (auto& p : reference) {
      auto g = torch::randn(p.sizes()) * (step % 3 == 0 ? 10.0 : 0.1);
      p.mutable_grad() = g;
      flat_grad.narrow(0, offset, p.numel()).copy_(g.reshape(-1));
      offset += p.numel();
    }
    torch_opt->step();
    for (auto& run : runs) kernel->step(run.param, run.grad, run.states, step + 1, kernel->default_hyperparameters(), workspace);
    if (step == 0) allocations_after_first = workspace.allocations();
  }
  CHECK(workspace.allocations() == allocations_after_first);
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

TEST_CASE("Adam on partitions and sub-groups equals torch::optim::Adam bitwise", "[optim]") {
  for (int world : {1, 2, 3, 4}) {
    for (double wd : {0.0, 0.01}) {
      for (bool amsgrad : {false, true}) {
        OptimizerOptions o;
        o.kind = OptimizerKind::Adam;
        o.lr = 1e-2, o.weight_decay = wd, o.amsgrad = amsgrad;
        INFO("world " << world << " weight_decay " << wd << " amsgrad " << amsgrad);
        for (int64_t sub_group : {int64_t(1) << 30, int64_t(7)})
          expect_same_as_torch(o, [&](std::vector<torch::Tensor> ps) {
            return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-2).weight_decay(wd).amsgrad(amsgrad));
          }, world, sub_group);
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
    }, world, 5);
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
    }, 3, 4);
  }
}

TEST_CASE("Adagrad on partitions equals torch::optim::Adagrad bitwise", "[optim]") {
  OptimizerOptions o;
  o.kind = OptimizerKind::Adagrad;
  o.lr = 0.1, o.lr_decay = 0.01, o.weight_decay = 1e-3, o.initial_accumulator_value = 0.1, o.eps = 1e-10;
  expect_same_as_torch(o, [](std::vector<torch::Tensor> ps) {
    return std::make_unique<torch::optim::Adagrad>(
        ps, torch::optim::AdagradOptions(0.1).lr_decay(0.01).weight_decay(1e-3).initial_accumulator_value(0.1).eps(1e-10));
  }, 2, 9);
}

TEST_CASE("Lion follows its closed form and is partition-invariant", "[optim]") {
  // One step from m = 0: update = sign((1 - b1) g) = sign(g); p' = p (1 - lr wd) - lr sign(g);
  // m' = (1 - b2) g. Computed here in double, compared within float rounding.
  OptimizerOptions o = tessera::optim::default_options(OptimizerKind::Lion);
  o.lr = 0.01, o.weight_decay = 0.1;
  auto kernel = make_optimizer_kernel(o);
  Workspace ws;
  auto p = torch::tensor({1.0f, -2.0f, 0.5f, 3.0f});
  auto g = torch::tensor({0.3f, -0.7f, 0.0f, -1e-3f});
  auto states = kernel->initial_states(p);
  auto p0 = p.clone();
  kernel->step(p, g, states, 1, kernel->default_hyperparameters(), ws);
  for (int i = 0; i < 4; ++i) {
    double gi = g[i].item<double>(), sign = gi > 0 ? 1 : (gi < 0 ? -1 : 0);
    double expected = p0[i].item<double>() * (1 - 0.01 * 0.1) - 0.01 * sign;
    CHECK(p[i].item<double>() == Approx(expected).epsilon(1e-6));
    CHECK(states[0][i].item<double>() == Approx((1 - 0.99) * gi).epsilon(1e-6));
  }
  // Partition invariance: one run over the whole buffer vs three over slices.
  o.weight_decay = 0.0;
  kernel = make_optimizer_kernel(o);
  torch::manual_seed(7);
  auto a = torch::randn({101}), b = a.clone();
  auto whole = kernel->initial_states(a);
  const int64_t bounds[] = {0, 40, 41, 101};
  std::vector<std::vector<torch::Tensor>> parts;
  for (int r = 0; r < 3; ++r) parts.push_back(kernel->initial_states(b.narrow(0, bounds[r], bounds[r + 1] - bounds[r])));
  for (int step = 1; step <= 5; ++step) {
    auto grad = torch::randn({101});
    kernel->step(a, grad, whole, step, kernel->default_hyperparameters(), ws);
    for (int r = 0; r < 3; ++r)
      kernel->step(b.narrow(0, bounds[r], bounds[r + 1] - bounds[r]), grad.narrow(0, bounds[r], bounds[r + 1] - bounds[r]),
                   parts[r], step, kernel->default_hyperparameters(), ws);
  }
  CHECK(torch::equal(a, b));
}

TEST_CASE("Kernels refuse mismatched inputs and bad options before changing anything", "[optim]") {
  auto kernel = make_optimizer_kernel(tessera::optim::default_options(OptimizerKind::Adam));
  Workspace ws;
  auto p = torch::ones({8}), g = torch::ones({8});
  auto states = kernel->initial_states(p);
  kernel->step(p, g, states, 1, kernel->default_hyperparameters(), ws);
  auto before = p.clone();
  auto state_before = states[0].clone();
  auto hp = kernel->default_hyperparameters();
  CHECK_THROWS_WITH(kernel->step(torch::ones({9}), torch::ones({9}), states, 2, hp, ws),
                    Catch::Contains("8 elements") && Catch::Contains("9 elements"));
  CHECK_THROWS_WITH(kernel->step(p, torch::ones({7}), states, 2, hp, ws), Catch::Contains("does not match"));
  CHECK_THROWS_WITH(kernel->step(p, g, {states[0]}, 2, hp, ws), Catch::Contains("expected 2 states"));
  CHECK_THROWS_WITH(kernel->step(p, g, states, 0, hp, ws), Catch::Contains("update number 0"));
  CHECK(torch::equal(p, before));
  CHECK(torch::equal(states[0], state_before));

  OptimizerOptions bad;
  bad.kind = OptimizerKind::Adam;
  bad.beta2 = 1.0;
  CHECK_THROWS_AS(make_optimizer_kernel(bad), tessera::ConfigError);
  CHECK_THROWS_WITH(make_optimizer_kernel(bad), Catch::Contains("optimizer.params.betas[1]"));
  bad = OptimizerOptions{};
  bad.kind = OptimizerKind::SGD;
  bad.nesterov = true;
  CHECK_THROWS_WITH(make_optimizer_kernel(bad), Catch::Contains("optimizer.params.dampening"));
  CHECK_THROWS_WITH(tessera::optim::parse_optimizer_kind("Adamm"), Catch::Contains("expected one of"));
}

TEST_CASE("States copied out and back continue a run bitwise", "[optim]") {
  // 3 steps, save the states; a fresh copy continues exactly like the original (what checkpoints
  // and offload rely on: the kernel holds nothing).
  auto kernel = make_optimizer_kernel(tessera::optim::default_options(OptimizerKind::AdamW));
  Workspace ws;
  torch::manual_seed(3);
  auto p = torch::randn({50});
  std::vector<torch::Tensor> grads;
  for (int i = 0; i < 6; ++i) grads.push_back(torch::randn({50}));
  auto states = kernel->initial_states(p);
  for (int i = 0; i < 3; ++i) kernel->step(p, grads[i], states, i + 1, kernel->default_hyperparameters(), ws);
  std::vector<torch::Tensor> saved;
  for (auto& s : states) saved.push_back(s.clone());
  auto q = p.clone();
  for (int i = 3; i < 6; ++i) {
    kernel->step(p, grads[i], states, i + 1, kernel->default_hyperparameters(), ws);
    kernel->step(q, grads[i], saved, i + 1, kernel->default_hyperparameters(), ws);
  }
  CHECK(torch::equal(p, q));
}
