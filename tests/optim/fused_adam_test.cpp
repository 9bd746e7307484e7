// The fused CPU Adam kernel (core/optim/fused_adam.h) on every SIMD path this machine has (the
// scalar one always, AVX2 and AVX-512 where the CPU runs them), against two independent
// computations, bit for bit:
//   LibTorch's torch::optim::Adam (L2 decay) and AdamW (decoupled) stepping a parameter 4 times
//   from zero states: the parameter, both moments and a bf16 copy (NaN-filled before, every
//   element written) after every step; lengths around each vector width (tails), 0 to 100,003;
//   LibTorch's step written as its ATen ops, at updates 1, 2, 37 and 10,000 (bias correction near
//   1) from random states and odd betas.
// Negative control: the unfused form of the first moment (product and sum rounded apart) differs
// from LibTorch's on the same inputs. Bad input is refused before anything changes.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/optim/fused_adam.h"

namespace optim = tessera::optim;
using optim::AdamDecay;
using optim::SimdPath;

namespace {

std::vector<SimdPath> available_paths() {
  std::vector<SimdPath> out;
  for (auto p : {SimdPath::scalar, SimdPath::avx2, SimdPath::avx512})
    if (optim::simd_path_available(p)) out.push_back(p);
  return out;
}

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         std::memcmp(a.contiguous().data_ptr(), b.contiguous().data_ptr(), size_t(a.numel() * a.element_size())) == 0;
}

struct Buffers {
  torch::Tensor param, exp_avg, exp_avg_sq, bf16;
  optim::FusedAdamRun run(const torch::Tensor& grad) {
    optim::FusedAdamRun r;
    r.param = param.data_ptr<float>(), r.grad = grad.data_ptr<float>();
    r.exp_avg = exp_avg.data_ptr<float>(), r.exp_avg_sq = exp_avg_sq.data_ptr<float>();
    r.param_bf16 = reinterpret_cast<uint16_t*>(bf16.data_ptr()), r.elements = param.numel();
    return r;
  }
};

Buffers fresh(const torch::Tensor& init) {
  auto nan_bf16 = torch::full({init.numel()}, -1, torch::kInt16);  // 0xFFFF: a NaN every element must overwrite
  return {init.clone(), torch::zeros_like(init), torch::zeros_like(init), nan_bf16};
}

}  // namespace

TEST_CASE("fused Adam: every SIMD path equals torch::optim::Adam / AdamW bit for bit", "[fused_adam]") {
  const auto paths = available_paths();
  INFO("paths: " << paths.size() << ", best " << optim::to_string(optim::best_simd_path()));
  struct Case {
    AdamDecay decay;
    double weight_decay;
  };
  for (const auto& c : {Case{AdamDecay::l2, 0.0}, Case{AdamDecay::l2, 0.01}, Case{AdamDecay::decoupled, 0.0},
                        Case{AdamDecay::decoupled, 0.1}}) {
    for (int64_t n : {0, 1, 5, 7, 8, 9, 15, 16, 17, 31, 33, 47, 63, 65, 1000, 4099, 100003}) {
      torch::manual_seed(n + 7);
      const auto init = torch::randn({n});
      std::vector<torch::Tensor> grads;
      for (int s = 0; s < 4; ++s) grads.push_back(torch::randn({n}) * (s + 1));
      auto p = init.clone().requires_grad_(true);
      std::unique_ptr<torch::optim::Optimizer> reference;
      if (c.decay == AdamDecay::l2)
        reference = std::make_unique<torch::optim::Adam>(
            std::vector<torch::Tensor>{p}, torch::optim::AdamOptions(2e-3).betas({0.9, 0.99}).eps(1e-7).weight_decay(c.weight_decay));
      else
        reference = std::make_unique<torch::optim::AdamW>(
            std::vector<torch::Tensor>{p}, torch::optim::AdamWOptions(2e-3).betas({0.9, 0.99}).eps(1e-7).weight_decay(c.weight_decay));
      std::vector<Buffers> ours;
      for (size_t k = 0; k < paths.size(); ++k) ours.push_back(fresh(init));
      for (int s = 0; s < 4; ++s) {
        p.mutable_grad() = grads[size_t(s)].clone();
        reference->step();
        optim::FusedAdamStep step;
        step.lr = 2e-3, step.beta1 = 0.9, step.beta2 = 0.99, step.eps = 1e-7;
        step.weight_decay = c.weight_decay, step.decay = c.decay, step.step = s + 1;
        for (size_t k = 0; k < paths.size(); ++k) {
          INFO("path " << optim::to_string(paths[k]) << ", n " << n << ", step " << s + 1 << ", weight decay "
                       << c.weight_decay << (c.decay == AdamDecay::l2 ? " (Adam)" : " (AdamW)"));
          optim::fused_adam(ours[k].run(grads[size_t(s)]), step, paths[k]);
          if (n == 0) continue;  // torch keeps no state for an empty parameter's moments to compare
          const auto& state = static_cast<torch::optim::AdamParamState&>(*reference->state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
          CHECK(bitwise_equal(ours[k].param, p.detach()));
          CHECK(bitwise_equal(ours[k].exp_avg, state.exp_avg()));
          CHECK(bitwise_equal(ours[k].exp_avg_sq, state.exp_avg_sq()));
          CHECK(bitwise_equal(ours[k].bf16.view(torch::kBFloat16), p.detach().to(torch::kBFloat16)));
        }
      }
    }
  }
}

// LibTorch 1.13's Adam / AdamW step for one parameter as ATen ops (torch/csrc/api/src/optim/adam.cpp,
// adamw.cpp), from given states at any update number.
void aten_adam(bool decoupled, double lr, double beta1, double beta2, double eps, double wd, int64_t step,
               torch::Tensor& p, const torch::Tensor& grad_in, torch::Tensor& exp_avg, torch::Tensor& exp_avg_sq) {
  torch::NoGradGuard no_grad;
  if (decoupled && wd != 0) p.mul_(1 - lr * wd);
  const auto grad = !decoupled && wd != 0 ? grad_in.add(p, wd) : grad_in;
  const double bc1 = 1 - std::pow(beta1, step), bc2 = 1 - std::pow(beta2, step);
  exp_avg.mul_(beta1).add_(grad, 1 - beta1);
  exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
  const auto denom = (exp_avg_sq.sqrt() / std::sqrt(bc2)).add_(eps);
  p.addcdiv_(exp_avg, denom, -(lr / bc1));
}

TEST_CASE("fused Adam: equals LibTorch's ATen ops at updates 1, 2, 37 and 10,000 from random states", "[fused_adam]") {
  const double lr = 3e-4, beta1 = 0.85, beta2 = 0.9995, eps = 1e-6, wd = 0.05;
  for (bool decoupled : {false, true}) {
    for (int64_t update : {1, 2, 37, 10000}) {
      torch::manual_seed(update);
      const int64_t n = 12345;
      const auto p0 = torch::randn({n}), g = torch::randn({n}), m0 = torch::randn({n}) * 0.1, v0 = torch::rand({n}) * 0.01;
      auto p = p0.clone(), m = m0.clone(), v = v0.clone();
      aten_adam(decoupled, lr, beta1, beta2, eps, wd, update, p, g, m, v);
      for (auto path : available_paths()) {
        INFO((decoupled ? "AdamW" : "Adam") << " update " << update << " path " << optim::to_string(path));
        Buffers b{p0.clone(), m0.clone(), v0.clone(), torch::empty({n}, torch::kInt16)};
        optim::FusedAdamStep step;
        step.lr = lr, step.beta1 = beta1, step.beta2 = beta2, step.eps = eps, step.weight_decay = wd;
        step.decay = decoupled ? AdamDecay::decoupled : AdamDecay::l2, step.step = update;
        optim::fused_adam(b.run(g), step, path);
        CHECK(bitwise_equal(b.param, p));
        CHECK(bitwise_equal(b.exp_avg, m));
        CHECK(bitwise_equal(b.exp_avg_sq, v));
      }
    }
  }
}

TEST_CASE("fused Adam: negative control: the unfused first moment differs from LibTorch's", "[fused_adam]") {
  torch::manual_seed(3);
  const int64_t n = 100003;
  const auto g = torch::randn({n}), m = torch::randn({n});
  const auto reference = m.clone().mul_(0.9).add_(g, 1 - 0.9);
  auto unfused = torch::empty({n});
  const float* G = g.data_ptr<float>();
  const float* M = m.data_ptr<float>();
  float* U = unfused.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) {
    volatile float product = M[i] * 0.9f, scaled = G[i] * float(1 - 0.9);  // rounded apart: no FMA
    U[i] = product + scaled;
  }
  const auto differing = torch::ne(unfused, reference).sum().item<int64_t>();
  INFO(differing << " of " << n << " elements differ");
  CHECK(differing > 0);
}

TEST_CASE("fused Adam: bad input is refused before anything changes", "[fused_adam]") {
  auto b = fresh(torch::ones({9}));
  const auto g = torch::ones({9});
  optim::FusedAdamStep step;
  step.step = 0;
  CHECK_THROWS_WITH(optim::fused_adam(b.run(g), step), Catch::Contains("update number 0 < 1"));
  step.step = 1;
  auto run = b.run(g);
  run.exp_avg = nullptr;
  CHECK_THROWS_WITH(optim::fused_adam(run, step), Catch::Contains("missing"));
  run = b.run(g);
  run.elements = -1;
  CHECK_THROWS_WITH(optim::fused_adam(run, step), Catch::Contains("negative length"));
  CHECK(torch::equal(b.param, torch::ones({9})));
  CHECK(torch::equal(b.exp_avg, torch::zeros({9})));
  for (auto path : {SimdPath::avx2, SimdPath::avx512})
    if (!optim::simd_path_available(path))
      CHECK_THROWS_WITH(optim::fused_adam(b.run(g), step, path), Catch::Contains("not available"));
}
