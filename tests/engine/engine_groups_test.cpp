// Parameter groups, client optimizers and initialize()'s returned optimizer and scheduler,
// against single-process LibTorch oracles that use torch::optim with the same groups.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

tessera::nn::GptConfig small_gpt() { return small_gpt_config(21); }

torch::Tensor rank_loss(tessera::nn::TinyGpt& model, int step, int rank) {
  auto b = corpus().batch(5, step, 0, 8, 16, rank, kWorld);
  return model.loss(b.tokens, b.targets);
}

// The usual split: matrices decay, vectors (LayerNorm weights and biases) do not.
bool is_vector(const torch::Tensor& p) { return p.dim() < 2; }

std::string config(int stage, bool with_optimizer, const std::string& extra = "") {
  std::string c = "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) + "\n" + extra;
  if (with_optimizer) c += "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.1\n";
  return c + "[zero_optimization]\nstage = " + std::to_string(stage) + "\nreduce_bucket_size = 4000\n";
}

tessera::config::Config load(const std::string& text) {
  return tessera::config::load_config_text(text, tessera::config::Format::toml, "groups_test");
}

using Factory = std::function<std::shared_ptr<torch::optim::Optimizer>(torch::nn::Module&)>;

// The oracle: LibTorch's optimizer with the groups `make` builds, on averaged rank gradients.
std::map<std::string, torch::Tensor> oracle(const Factory& make, int steps) {
  tessera::nn::TinyGpt model(small_gpt());
  auto optimizer = make(*model.module());
  auto params = model.module()->parameters();
  for (int step = 0; step < steps; ++step) {
    average_rank_gradients(params, [&](int rank) { return rank_loss(model, step, rank); });
    optimizer->step();
  }
  return snapshot_parameters(*model.module());
}

std::map<std::string, torch::Tensor> train(tessera::nn::TinyGpt& model, tessera::Engine& engine, int steps) {
  for (int step = 0; step < steps; ++step) {
    engine.backward(rank_loss(model, step, kRank));
    engine.step();
  }
  return snapshot_parameters(*model.module());
}

std::shared_ptr<torch::optim::Optimizer> adamw_two_groups(torch::nn::Module& m) {
  std::vector<torch::Tensor> matrices, vectors;
  for (auto& p : m.parameters()) (is_vector(p) ? vectors : matrices).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(
                                    torch::optim::AdamWOptions(3e-3).weight_decay(0.1)));
  groups.emplace_back(vectors, std::make_unique<torch::optim::AdamWOptions>(
                                   torch::optim::AdamWOptions(1e-3).weight_decay(0.0)));
  return std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(3e-3));
}

std::shared_ptr<torch::optim::Optimizer> sgd_two_groups(torch::nn::Module& m) {
  std::vector<torch::Tensor> matrices, vectors;
  for (auto& p : m.parameters()) (is_vector(p) ? vectors : matrices).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(matrices, std::make_unique<torch::optim::SGDOptions>(
                                    torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-3)));
  groups.emplace_back(vectors, std::make_unique<torch::optim::SGDOptions>(
                                   torch::optim::SGDOptions(0.02).momentum(0.9).nesterov(true)));
  return std::make_shared<torch::optim::SGD>(groups, torch::optim::SGDOptions(0.05));
}

}  // namespace

TEST_CASE("Two parameter groups (decay / no decay, own lr) equal LibTorch's AdamW with those groups",
          "[engine][groups]") {
  const auto expected = oracle(adamw_two_groups, 6);
  for (int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    tessera::nn::TinyGpt model(small_gpt());
    std::vector<tessera::ParamGroup> groups(2);
    for (auto& item : model.module()->named_parameters())
      groups[is_vector(item.value()) ? 1 : 0].names.push_back(item.key());
    groups[1].lr = 1e-3;
    groups[1].weight_decay = 0.0;
    tessera::InitializeOptions options;
    options.param_groups = groups;
    auto [engine, optimizer, scheduler] = tessera::initialize(model.module(), load(config(stage, true)), options);
    CHECK(scheduler == nullptr);
    REQUIRE(optimizer->num_param_groups() == 2);
    CHECK(optimizer->param_group_options(1).weight_decay == 0.0);
    CHECK(optimizer->get_lr(1) == 1e-3);
    CHECK(engine->get_lrs() == std::vector<double>{3e-3, 1e-3});
    CHECK(optimizer->param_group_names(1).size() == groups[1].names.size());
    expect_same_parameters(train(model, *engine, 6), expected);
  }
}

TEST_CASE("A client torch::optim optimizer (SGD, two groups, nesterov) equals itself run by LibTorch",
          "[engine][groups]") {
  const auto expected = oracle(sgd_two_groups, 6);
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    tessera::nn::TinyGpt model(small_gpt());
    tessera::InitializeOptions options;
    options.optimizer = sgd_two_groups(*model.module());
    auto init = tessera::initialize(model.module(), load(config(stage, false)), options);
    CHECK(init.optimizer->param_group_options(0).kind == tessera::optim::OptimizerKind::SGD);
    CHECK(init.optimizer->param_group_options(1).nesterov);
    expect_same_parameters(train(model, *init.engine, 6), expected);
  }
}

TEST_CASE("A client AdamW with the same groups equals the param_groups route", "[engine][groups]") {
  const auto expected = oracle(adamw_two_groups, 4);
  tessera::nn::TinyGpt model(small_gpt());
  tessera::InitializeOptions options;
  options.optimizer = adamw_two_groups(*model.module());
  auto init = tessera::initialize(model.module(), load(config(2, false)), options);
  expect_same_parameters(train(model, *init.engine, 4), expected);
}

// torch::optim::Adagrad builds a step-0 state for every parameter in its constructor: a fresh
// Adagrad is not an optimizer that "already holds state".
TEST_CASE("A client Adagrad (step-0 states from its constructor) is translated and equals itself run by LibTorch",
          "[engine][groups]") {
  auto adagrad = [](torch::nn::Module& m) -> std::shared_ptr<torch::optim::Optimizer> {
    return std::make_shared<torch::optim::Adagrad>(
        m.parameters(), torch::optim::AdagradOptions(0.05).lr_decay(0.01).initial_accumulator_value(0.1));
  };
  const auto expected = oracle(adagrad, 4);
  tessera::nn::TinyGpt model(small_gpt());
  tessera::InitializeOptions options;
  options.optimizer = adagrad(*model.module());
  auto init = tessera::initialize(model.module(), load(config(1, false)), options);
  CHECK(init.optimizer->param_group_options(0).kind == tessera::optim::OptimizerKind::Adagrad);
  expect_same_parameters(train(model, *init.engine, 4), expected);
}

TEST_CASE("A client optimizer of another class (RMSprop, two groups) runs by its own step() on the partitions",
          "[engine][groups]") {
  auto rmsprop_two_groups = [](torch::nn::Module& m) -> std::shared_ptr<torch::optim::Optimizer> {
    std::vector<torch::Tensor> matrices, vectors;
    for (auto& p : m.parameters()) (is_vector(p) ? vectors : matrices).push_back(p);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(matrices, std::make_unique<torch::optim::RMSpropOptions>(
                                      torch::optim::RMSpropOptions(2e-3).alpha(0.95).momentum(0.5).weight_decay(1e-3)));
    groups.emplace_back(vectors, std::make_unique<torch::optim::RMSpropOptions>(torch::optim::RMSpropOptions(1e-3)));
    return std::make_shared<torch::optim::RMSprop>(groups, torch::optim::RMSpropOptions(2e-3));
  };
  const auto expected = oracle(rmsprop_two_groups, 5);
  for (int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    tessera::nn::TinyGpt model(small_gpt());
    tessera::InitializeOptions options;
    options.optimizer = rmsprop_two_groups(*model.module());
    auto init = tessera::initialize(model.module(), load(config(stage, false)), options);
    CHECK(init.engine->get_lrs() == std::vector<double>{2e-3, 1e-3});
    expect_same_parameters(train(model, *init.engine, 5), expected);
    // Its states are its own: storage maps describe weights and masters only.
    const auto maps = init.engine->storage_maps().maps;
    CHECK(maps.size() == 2 * model.module()->parameters().size());
    for (const auto& m : maps) CHECK((m.kind == "param" || m.kind == "master"));
  }
}

TEST_CASE("Schedules set each group's lr as DeepSpeed's do; set_lr works without one", "[engine][groups]") {
  auto two_groups = [](tessera::nn::TinyGpt& model) {
    std::vector<tessera::ParamGroup> groups(2);
    for (auto& item : model.module()->named_parameters()) groups[is_vector(item.value()) ? 1 : 0].params.push_back(item.value());
    groups[1].lr = 1e-3;
    groups[1].weight_decay = 0.0;
    tessera::InitializeOptions options;
    options.param_groups = groups;
    return options;
  };
  {
    // WarmupCosineLR scales each group's own lr: after warmup both are at their base lr.
    tessera::nn::TinyGpt model(small_gpt());
    auto init = tessera::initialize(
        model.module(),
        load(config(1, true, "[scheduler]\ntype = \"WarmupCosineLR\"\n[scheduler.params]\ntotal_num_steps = 100\nwarmup_num_steps = 2\n")),
        two_groups(model));
    REQUIRE(init.lr_scheduler != nullptr);
    CHECK(init.lr_scheduler->last_batch_iteration() == -1);
    train(model, *init.engine, 3);
    CHECK(init.lr_scheduler->last_batch_iteration() == 2);
    const auto lrs = init.lr_scheduler->get_last_lr();
    REQUIRE(lrs.size() == 2);
    CHECK(lrs[1] / lrs[0] == Approx(1e-3 / 3e-3).epsilon(1e-12));
    CHECK_THROWS_WITH(init.optimizer->set_lr(1.0), Catch::Contains("scheduler"));
  }
  {
    // WarmupLR sets one value for every group (DeepSpeed's warmup_max_lr applies to all).
    tessera::nn::TinyGpt model(small_gpt());
    auto init = tessera::initialize(
        model.module(),
        load(config(1, true, "[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_max_lr = 0.002\nwarmup_num_steps = 10\n")),
        two_groups(model));
    train(model, *init.engine, 2);
    const auto lrs = init.engine->get_lrs();
    CHECK(lrs[0] == lrs[1]);
  }
  {
    // Without a scheduler, set_lr changes the lr of the next updates; the oracle does the same.
    tessera::nn::TinyGpt model(small_gpt());
    auto init = tessera::initialize(model.module(), load(config(2, true)), two_groups(model));
    train(model, *init.engine, 2);
    init.optimizer->set_lr(5e-4, 1);
    CHECK(init.engine->get_lrs() == std::vector<double>{3e-3, 5e-4});
    for (int step = 2; step < 4; ++step) {
      init.engine->backward(rank_loss(model, step, kRank));
      init.engine->step();
    }
    tessera::nn::TinyGpt reference(small_gpt());
    auto opt = adamw_two_groups(*reference.module());
    auto params = reference.module()->parameters();
    for (int step = 0; step < 4; ++step) {
      if (step == 2) opt->param_groups()[1].options().set_lr(5e-4);
      average_rank_gradients(params, [&](int rank) { return rank_loss(reference, step, rank); });
      opt->step();
    }
    expect_same_parameters(snapshot_parameters(*model.module()), snapshot_parameters(*reference.module()));
  }
}

TEST_CASE("Bad groups and client optimizers are refused before the model changes", "[engine][groups]") {
  tessera::nn::TinyGpt model(small_gpt());
  const auto before = snapshot_parameters(*model.module());
  auto named = model.module()->named_parameters();
  auto attempt = [&](tessera::InitializeOptions options, bool with_optimizer = true) {
    tessera::initialize(model.module(), load(config(1, with_optimizer)), options);
  };
  tessera::InitializeOptions twice;
  twice.param_groups.resize(2);
  for (auto& item : named) twice.param_groups[0].names.push_back(item.key());
  twice.param_groups[1].names.push_back("wte.weight");
  CHECK_THROWS_WITH(attempt(twice), Catch::Contains("'wte.weight'") && Catch::Contains("param group 1"));
  tessera::InitializeOptions missing;
  missing.param_groups.resize(1);
  missing.param_groups[0].names.push_back("wte.weight");
  CHECK_THROWS_WITH(attempt(missing), Catch::Contains("in no param group"));
  tessera::InitializeOptions unknown;
  unknown.param_groups.resize(1);
  unknown.param_groups[0].names.push_back("wte.wieght");
  CHECK_THROWS_WITH(attempt(unknown), Catch::Contains("'wte.wieght'"));
  tessera::InitializeOptions stranger;
  stranger.param_groups.resize(1);
  for (auto& item : named) stranger.param_groups[0].params.push_back(item.value());
  stranger.param_groups[0].params.push_back(torch::zeros({3}, torch::requires_grad()));
  CHECK_THROWS_WITH(attempt(stranger), Catch::Contains("not a parameter of the model"));
  tessera::InitializeOptions both;
  both.optimizer = adamw_two_groups(*model.module());
  CHECK_THROWS_WITH(attempt(both), Catch::Contains("both a client optimizer and an `optimizer` config section"));
  tessera::InitializeOptions used;
  used.optimizer = std::make_shared<torch::optim::RMSprop>(model.module()->parameters(), torch::optim::RMSpropOptions(1e-3));
  average_rank_gradients(model.module()->parameters(), [&](int rank) { return rank_loss(model, 0, rank); });
  used.optimizer->step();  // now it holds state for every parameter
  for (const auto& [name, p] : snapshot_parameters(*model.module())) {
    torch::NoGradGuard no_grad;
    model.module()->named_parameters()[name].copy_(before.at(name));  // undo the step, keep the state
  }
  CHECK_THROWS_WITH(attempt(used, false), Catch::Contains("already holds state"));
  tessera::InitializeOptions none;
  CHECK_THROWS_WITH(attempt(none, false), Catch::Contains("optimizer"));
  for (const auto& [name, p] : snapshot_parameters(*model.module())) CHECK(torch::equal(p, before.at(name)));
}
