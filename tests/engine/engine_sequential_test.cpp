// ZeRO-3 on stock torch::nn::Sequential models (core/zero/sequential_units.h): no tessera::Unit
// holder anywhere, a Sequential inside a module of a Sequential, a holder put into a Sequential (which calls the module, not
// the holder). Training at stage 3 against the single-process oracle (every rank's batch here,
// gradients averaged as the engine does, LibTorch's AdamW): bitwise at 2 ranks, relative L2 <= 1e-5
// at 4. The entries are swapped only while the engine lives, and a failed initialize puts them back.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/zero/unit_holder.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

constexpr int64_t kIn = 12;

// A module of its own whose forward runs a Sequential (LibTorch cannot nest Sequentials directly).
struct BlockImpl : torch::nn::Module {
  BlockImpl() { inner = register_module("inner", torch::nn::Sequential(torch::nn::Linear(24, 16), torch::nn::Tanh())); }
  torch::Tensor forward(torch::Tensor x) { return inner->forward(x); }
  torch::nn::Sequential inner{nullptr};
};
TORCH_MODULE(Block);

torch::nn::Sequential make_model() {
  torch::manual_seed(19);
  return torch::nn::Sequential(torch::nn::Linear(kIn, 24), torch::nn::ReLU(),
                               tessera::Unit<torch::nn::Linear>(24, 24),  // a holder inside a Sequential
                               torch::nn::LayerNorm(torch::nn::LayerNormOptions({24})),
                               Block(),
                               torch::nn::Linear(16, 1));
}

torch::Tensor batch(int rank, int step) {
  auto g = at::detail::createCPUGenerator(uint64_t(1000 * step + rank));
  return torch::randn({6, kIn}, g);
}

torch::Tensor loss_of(torch::nn::Sequential& model, const torch::Tensor& x) {
  return (model->forward(x) - x.narrow(1, 0, 1)).pow(2).mean();
}

std::string config_toml(int stage) {
  return "train_micro_batch_size_per_gpu = 6\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-2\n"
         "weight_decay = 0.01\n[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nstage3_param_persistence_threshold = 0\nstage3_prefetch_bucket_size = 700\n"
         "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

constexpr int kSteps = 8;

std::map<std::string, torch::Tensor> train_oracle() {
  auto model = make_model();
  auto params = model->parameters();
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  for (int step = 0; step < kSteps; ++step) {
    average_rank_gradients(params, [&](int rank) { return loss_of(model, batch(rank, step)); });
    adamw.step();
  }
  return snapshot_parameters(*model);
}

}  // namespace

TEST_CASE("A stock Sequential trains at stage 3 as the single-process oracle does", "[sequential]") {
  auto model = make_model();
  auto engine = tessera::initialize(model.ptr(), tessera::config::load_config_text(config_toml(3),
                                                                                   tessera::config::Format::toml, "seq"))
                    .engine;
  for (int step = 0; step < kSteps; ++step) {
    engine->backward(loss_of(model, batch(kRank, step)));
    engine->step();
    // Between steps every parameter is released (threshold 0: no persistent ones).
    for (const auto& p : model->parameters()) CHECK(p.storage().nbytes() == 0);
  }
  // The entries still report their own modules; parameter names did not change.
  CHECK(model->ptr(0)->name() == "torch::nn::LinearImpl");
  CHECK(model[2]->name() == "torch::nn::LinearImpl");
  std::map<std::string, torch::Tensor> trained;
  {
    auto gathered = engine->gathered_parameters();
    trained = snapshot_parameters(*model);
  }
  CHECK(trained.count("4.inner.0.weight") == 1);
  const auto stats = engine->stage3_stats();
  INFO("fetches " << stats.fetches << ", prefetched " << stats.prefetched);
  CHECK(stats.fetches > 0);
  CHECK(stats.prefetched > 0);  // the recorded order is followed through the Sequential
  expect_same_parameters(trained, train_oracle());
  // Without the engine the Sequential is as it was: typed access to its entries works again.
  engine.reset();
  CHECK(model->ptr<torch::nn::LinearImpl>(0) != nullptr);
  CHECK(model[4]->as<Block>()->inner->ptr<torch::nn::LinearImpl>(0) != nullptr);
}

TEST_CASE("Stage 3 on a Sequential equals stage 0 on it", "[sequential]") {
  std::map<std::string, torch::Tensor> results[2];
  for (int which = 0; which < 2; ++which) {
    auto model = make_model();
    auto engine = tessera::initialize(model.ptr(), tessera::config::load_config_text(
                                                       config_toml(which ? 3 : 0), tessera::config::Format::toml, "seq"))
                      .engine;
    for (int step = 0; step < kSteps; ++step) {
      engine->backward(loss_of(model, batch(kRank, step)));
      engine->step();
    }
    auto gathered = engine->gathered_parameters();
    results[which] = snapshot_parameters(*model);
  }
  expect_same_parameters(results[1], results[0]);
}

TEST_CASE("A unit neither a holder nor a Sequential calls is refused, and the Sequential is put back", "[sequential]") {
  auto model = make_model();
  auto list = torch::nn::ModuleList(torch::nn::Linear(2, 2));  // called by hand: no bracket possible
  model->register_module("extra", list);
  const auto before = snapshot_parameters(*model);
  try {
    tessera::initialize(model.ptr(), tessera::config::load_config_text(config_toml(3), tessera::config::Format::toml, "seq"));
    FAIL("initialize accepted a unit nobody brackets");
  } catch (const tessera::Error& e) {
    const std::string what = e.what();
    INFO(what);
    CHECK(what.find("'extra.0'") != std::string::npos);
    CHECK(what.find("torch::nn::Sequential") != std::string::npos);
    CHECK(what.find("'0'") == std::string::npos);  // the Sequential's own entries were accepted
  }
  CHECK(model->ptr<torch::nn::LinearImpl>(0) != nullptr);  // swapped entries put back
  CHECK(model[4]->as<Block>()->inner->ptr<torch::nn::LinearImpl>(0) != nullptr);
  expect_same_parameters(snapshot_parameters(*model), before);
}
