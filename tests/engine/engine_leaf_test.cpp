// ZeRO-3 leaf modules and the gather-order check, with a mixture-of-experts block whose ranks route
// their tokens to different experts: rank r's tokens all go to expert r % 2, and an expert with no
// tokens is not run (the dynamic part). Without a leaf mark every expert is a unit, the ranks
// gather different units, and every rank gets an error naming the ranks, the units and the gather
// number (DeepSpeed hangs here). Marked a leaf (by class, by name, by the config block, or by
// DeepSpeed's default class name), the block is one unit and training equals the single-process
// oracle: bitwise at 2 ranks, relative L2 <= 1e-5 at 4.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/zero/leaf_modules.h"
#include "core/zero/unit_holder.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

constexpr int64_t kWidth = 16, kExperts = 2;

// Routes each token by the sign of its first feature; runs only the experts that got tokens.
struct RoutedExpertsImpl : torch::nn::Module {
  RoutedExpertsImpl() {
    for (int64_t e = 0; e < kExperts; ++e)
      experts.push_back(register_module("expert" + std::to_string(e), torch::nn::Linear(kWidth, kWidth)));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto route = (x.select(-1, 0) > 0).to(torch::kLong);  // [N]: 0 or 1
    auto out = torch::zeros_like(x);
    for (int64_t e = 0; e < kExperts; ++e) {
      auto idx = (route == e).nonzero().squeeze(-1);
      if (idx.numel() == 0) continue;
      out = out.index_add(0, idx, experts[size_t(e)](x.index_select(0, idx)));
    }
    return out;
  }
  std::vector<tessera::Unit<torch::nn::Linear>> experts;
};
TORCH_MODULE(RoutedExperts);
// Named like Mixtral's block: a leaf by DeepSpeed's default classes, without any configuration.
struct MixtralSparseMoeBlockImpl : RoutedExpertsImpl {};
TORCH_MODULE(MixtralSparseMoeBlock);

template <class Block>
struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(5);
    in = register_module("in", torch::nn::Linear(kWidth, kWidth));
    moe = register_module("moe", Block());
    out = register_module("out", torch::nn::Linear(kWidth, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return out(torch::tanh(moe(in(x)))); }
  tessera::Unit<torch::nn::Linear> in{nullptr}, out{nullptr};
  tessera::Unit<Block> moe{nullptr};
};

// Rank r's batch: 8 tokens whose first feature after `in` has the sign of rank parity (the
// projection `in` is fixed to keep feature 0 = the input's feature 0 scaled up).
torch::Tensor batch(int rank, int step) {
  auto g = at::detail::createCPUGenerator(uint64_t(100 * step + rank));
  auto x = torch::randn({8, kWidth}, g);
  x.select(1, 0).copy_(torch::full({8}, rank % 2 ? 3.0f : -3.0f));
  return x;
}

torch::Tensor loss_of(torch::nn::Module& net, const torch::Tensor& x) {
  auto* plain = dynamic_cast<NetImpl<RoutedExperts>*>(&net);
  auto y = plain ? plain->forward(x) : dynamic_cast<NetImpl<MixtralSparseMoeBlock>&>(net).forward(x);
  return y.pow(2).mean();
}

template <class Block>
std::shared_ptr<NetImpl<Block>> make_net() {
  auto net = std::make_shared<NetImpl<Block>>();
  torch::NoGradGuard no_grad;
  // `in` passes feature 0 through (x3) so the routing follows the batch's sign pattern.
  net->in->weight.select(0, 0).zero_();
  net->in->weight[0][0] = 1.0;
  net->in->bias[0] = 0.0;
  return net;
}

std::string toml(const std::string& extra = "") {
  return "train_micro_batch_size_per_gpu = 8\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-2\nweight_decay = 0.01\n"
         "[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = 20\n" + extra +
         "[tessera.transport]\ncollective_timeout_ms = 20000\n";
}

template <class Block>
std::map<std::string, torch::Tensor> train(const std::shared_ptr<NetImpl<Block>>& net, const std::string& config_extra) {
  auto engine = tessera::initialize(net, tessera::config::load_config_text(toml(config_extra), tessera::config::Format::toml, "leaf")).engine;
  for (int step = 0; step < 5; ++step) {
    engine->backward(loss_of(*net, batch(kRank, step)));
    engine->step();
  }
  auto gathered = engine->gathered_parameters();
  return snapshot_parameters(*net);
}

template <class Block>
std::map<std::string, torch::Tensor> oracle() {
  auto net = make_net<Block>();
  auto params = net->parameters();
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  for (int step = 0; step < 5; ++step) {
    // (g_0 + ... + g_W-1) / W as the engine averages; an expert no token reached has gradient zero.
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      loss_of(*net, batch(rank, step)).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad().defined() ? params[i].grad() : torch::zeros_like(params[i]);
        sums[i] = rank == 0 ? g.clone() : sums[i].add_(g);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i].div_(kWorld);
    adamw.step();
  }
  return snapshot_parameters(*net);
}

}  // namespace

TEST_CASE("Class patterns: with or without namespace and Impl; dotted Python paths by their last part", "[leaf]") {
  using tessera::z3_class_matches;
  CHECK(z3_class_matches("Linear", "torch::nn::LinearImpl"));
  CHECK(z3_class_matches("LinearImpl", "torch::nn::LinearImpl"));
  CHECK(z3_class_matches("torch::nn::Linear", "torch::nn::LinearImpl"));
  CHECK(z3_class_matches("torch.nn.Linear", "torch::nn::LinearImpl"));
  CHECK(z3_class_matches("transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
                         "(anonymous namespace)::MixtralSparseMoeBlockImpl"));
  CHECK_FALSE(z3_class_matches("Linear", "torch::nn::LinearSomething"));
  CHECK_FALSE(z3_class_matches("other::Linear", "torch::nn::LinearImpl"));
  CHECK_FALSE(z3_class_matches("Embedding", "torch::nn::LinearImpl"));
  CHECK_FALSE(z3_class_matches("", "torch::nn::LinearImpl"));
}

TEST_CASE("Marks by class, name and suffix; an unknown name is refused", "[leaf]") {
  auto net = make_net<RoutedExperts>();
  CHECK(tessera::set_z3_leaf_modules(*net, {"RoutedExperts"}) == std::vector<std::string>{"moe"});
  CHECK(tessera::get_z3_leaf_modules(*net) == std::vector<std::string>{"moe"});
  tessera::unset_z3_leaf_modules(*net);
  CHECK(tessera::get_z3_leaf_modules(*net).empty());
  CHECK(tessera::set_z3_leaf_modules_by_suffix(*net, {"expert1"}) == std::vector<std::string>{"moe.expert1"});
  CHECK(tessera::set_z3_leaf_modules_by_suffix(*net, {"xpert1"}).empty());  // whole components only
  tessera::unset_z3_leaf_modules(*net);
  CHECK_THROWS_WITH(tessera::set_z3_leaf_modules_by_name(*net, {"moe", "nope"}), Catch::Contains("'nope'"));
  CHECK(tessera::get_z3_leaf_modules(*net).empty());
  CHECK(tessera::set_z3_leaf_modules_by_name(*net, {"moe"}) == std::vector<std::string>{"moe"});
  tessera::unset_z3_leaf_modules(*net);
  // The config's names must exist.
  auto fresh = make_net<RoutedExperts>();
  CHECK_THROWS_WITH(train(fresh, "[zero_optimization.leaf_module]\nnames = [\"moe.nope\"]\n"),
                    Catch::Contains("zero_optimization.leaf_module.names") && Catch::Contains("moe.nope"));
}

TEST_CASE("A leaf MoE block (by class, by name, by config, by default class) trains as the oracle does", "[leaf]") {
  const auto expected = oracle<RoutedExperts>();
  for (const std::string how : {"class", "name", "config"}) {
    INFO("leaf by " << how << ", world " << kWorld);
    auto net = make_net<RoutedExperts>();
    std::string extra;
    if (how == "class") tessera::set_z3_leaf_modules(*net, {"RoutedExperts"});
    if (how == "name") tessera::set_z3_leaf_modules_by_name(*net, {"moe"});
    if (how == "config") extra = "[zero_optimization.leaf_module]\nclasses = [\"my_package.layers.RoutedExperts\"]\n";
    expect_same_parameters(train(net, extra), expected);
    tessera::unset_z3_leaf_modules(*net);
  }
  INFO("Mixtral's class name, no configuration");
  expect_same_parameters(train(make_net<MixtralSparseMoeBlock>(), ""), oracle<MixtralSparseMoeBlock>());
}

// Last: the divergent run leaves its engine's parameter communicator unusable.
TEST_CASE("Without a leaf mark, ranks routing to different experts get an error naming ranks, units and the gather",
          "[leaf]") {
  auto net = make_net<RoutedExperts>();
  if (kWorld == 1) {  // one rank cannot diverge: it trains as the oracle
    expect_same_parameters(train(net, ""), oracle<RoutedExperts>());
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_WITH(train(net, ""), Catch::Contains("gather different units") && Catch::Contains("rank 0 unit 'moe.expert0'") &&
                                        Catch::Contains("rank 1 unit 'moe.expert1'") && Catch::Contains("leaf module"));
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}
