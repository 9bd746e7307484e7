// FlatParameters and GradReadyHooks on stock LibTorch modules against an untouched copy of the
// same model (the oracle): same outputs, same gradients bitwise, hooks once per backward.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <map>

#include "core/zero/flat_parameters.h"
#include "core/zero/grad_ready_hooks.h"

using tessera::zero::FlatGradients;
using tessera::zero::FlatParameters;
using tessera::zero::GradReadyHooks;

namespace {

struct Net : torch::nn::Module {
  Net() {
    fc1 = register_module("fc1", torch::nn::Linear(5, 7));
    fc2 = register_module("fc2", torch::nn::Linear(7, 3));
  }
  // fc1 is applied twice: its AccumulateGrad still fires once per backward.
  torch::Tensor forward(torch::Tensor x) {
    auto h = torch::relu(fc1(x));
    auto h2 = fc1(x * 0.5);
    return fc2(h + torch::tanh(h2));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};

std::vector<std::pair<std::string, torch::Tensor>> named(torch::nn::Module& m) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (auto& item : m.named_parameters()) out.emplace_back(item.key(), item.value());
  return out;
}

void copy_weights(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters();
  for (auto& item : to.named_parameters()) item.value().copy_(src[item.key()]);
}

}  // namespace

TEST_CASE("Parameters become views of the flat buffer; outputs and gradients stay bitwise", "[zero]") {
  torch::manual_seed(0);
  auto model = std::make_shared<Net>();
  auto oracle = std::make_shared<Net>();
  copy_weights(*model, *oracle);
  FlatParameters flat(named(*model), /*dp_size=*/3);
  FlatGradients grads(flat);
  // 35 + 7 + 21 + 3 = 66 elements, already a multiple of 3.
  CHECK(flat.layout().numel == 66);
  const auto* base = static_cast<const char*>(flat.buffer().data_ptr());
  auto params = named(*model);
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(static_cast<const char*>(params[i].second.data_ptr()) == base + flat.layout().params[i].offset * 4);
    CHECK(params[i].second.requires_grad());
  }
  auto x = torch::randn({4, 5});
  for (int micro = 0; micro < 2; ++micro) {  // two backwards accumulate
    auto y = model->forward(x + micro);
    auto y_ref = oracle->forward(x + micro);
    CHECK(torch::equal(y, y_ref));
    y.pow(2).sum().backward();
    y_ref.pow(2).sum().backward();
  }
  auto oracle_params = oracle->named_parameters();
  for (auto& [name, p] : named(*model)) {
    INFO(name);
    CHECK(torch::equal(p.grad(), oracle_params[name].grad()));
  }
  CHECK(grads.attached());
  // An update written into one partition is the module's new weight.
  flat.partition(1).fill_(0.25f);
  CHECK(model->fc1->bias[0].item<float>() == 0.25f);  // fc1.bias occupies [35, 42), rank 1 owns [22, 44)
  grads.zero();
  CHECK(grads.buffer().abs().sum().item<float>() == 0.0f);
  model->fc2->bias.mutable_grad() = torch::ones({3});  // a user replaces a .grad
  CHECK_FALSE(grads.attached());
  grads.zero();
  CHECK(grads.attached());
  // A layout made for other parameters is refused.
  auto other = tessera::zero::make_flat_group_layout({"x"}, {4}, 1);
  CHECK_THROWS_WITH(FlatParameters(named(*oracle), other), Catch::Contains("the layout has 1 parameters"));
}

TEST_CASE("GradReadyHooks fire once per parameter per backward, after accumulation", "[zero]") {
  torch::manual_seed(1);
  auto model = std::make_shared<Net>();
  FlatParameters flat(named(*model), 2);
  FlatGradients grads(flat);
  std::map<int64_t, int> fired;
  std::vector<int64_t> order;
  int ends = 0;
  bool grad_complete_at_hook = true;
  auto params = flat.parameters();
  {
    GradReadyHooks hooks(params,
                         [&](int64_t i) {
                           ++fired[i];
                           order.push_back(i);
                           grad_complete_at_hook &= params[i].grad().abs().sum().item<float>() > 0;
                         },
                         [&] { ++ends; });
    for (int iteration = 0; iteration < 3; ++iteration) {
      grads.zero();
      model->forward(torch::randn({2, 5})).sum().backward();
    }
  }
  CHECK(fired.size() == params.size());
  for (auto& [i, n] : fired) CHECK(n == 3);
  CHECK(ends == 3);
  CHECK(grad_complete_at_hook);
  // Disarmed after destruction: another backward calls nothing.
  const auto before = order.size();
  model->forward(torch::randn({2, 5})).sum().backward();
  CHECK(order.size() == before);
}
