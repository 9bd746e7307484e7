// ZeRO inference: initialize at stage 3 without an optimizer partitions every parameter (trainable
// or frozen) and runs forwards only, as DeepSpeed's ZeRO inference does under Accelerate's
// prepare(model). Oracle: the same model built again and never partitioned. Also the GRPO shape:
// a policy training at stage 3 beside its frozen reference as an inference engine.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

std::shared_ptr<tessera::Engine> engine_for(std::shared_ptr<torch::nn::Module> m, const std::string& text) {
  return tessera::initialize(std::move(m), tessera::config::load_config_text(text, tessera::config::Format::toml, "inference"))
      .engine;
}

const std::string kInference = "train_micro_batch_size_per_gpu = 4\n[zero_optimization]\nstage = 3\n"
                               "stage3_param_persistence_threshold = 100\n[tessera.transport]\ncollective_timeout_ms = 60000\n";

torch::Tensor tokens(int rank, int i) {
  auto g = at::detail::createCPUGenerator(uint64_t(10 * i + rank));
  return torch::randint(0, 256, {4, 16}, g, torch::kLong);
}

}  // namespace

TEST_CASE("A stage-3 engine without an optimizer runs forwards bitwise equal to the unpartitioned model", "[inference]") {
  for (bool frozen : {false, true}) {
    INFO("parameters frozen: " << frozen);
    tessera::nn::TinyGpt model(small_gpt_config(21)), oracle(small_gpt_config(21));
    if (frozen)
      for (auto& p : model.module()->parameters()) p.set_requires_grad(false);
    auto engine = engine_for(model.module(), kInference);
    // Every parameter is partitioned: between forwards a rank holds its partitions and the
    // persistent ones (LayerNorms), not the model.
    const auto memory = engine->memory();
    const int64_t model_bytes = tessera::nn::gpt_parameter_count(small_gpt_config(21)) * 4;
    INFO("parameter bytes " << memory.parameters << " of " << model_bytes);
    if (kWorld > 1) CHECK(memory.parameters < model_bytes * 2 / 3);
    CHECK(memory.gradients == 0);
    CHECK(memory.optimizer_states == 0);
    for (int i = 0; i < 3; ++i) {
      torch::NoGradGuard no_grad;
      CHECK(torch::equal(model.forward(tokens(kRank, i)), oracle.forward(tokens(kRank, i))));
    }
    {
      torch::InferenceMode inference;
      CHECK(torch::equal(model.forward(tokens(kRank, 7)), oracle.forward(tokens(kRank, 7))));
    }
    CHECK(model.module()->named_parameters()["h.0.mlp.c_fc.weight"].storage().nbytes() == 0);
    CHECK(engine->stage3_stats().fetches > 0);
    // Storage maps: the weights only (no optimizer, no masters).
    for (const auto& m : engine->storage_maps().maps) CHECK(m.kind == "param");
    CHECK_THROWS_WITH(engine->step(), Catch::Contains("ZeRO inference"));
    CHECK_THROWS_WITH(engine->zero_grad(), Catch::Contains("ZeRO inference"));
    if (!frozen) {
      auto loss = model.loss(tokens(kRank, 0), tokens(kRank, 1));
      CHECK_THROWS_WITH(engine->backward(loss), Catch::Contains("ZeRO inference"));
    }
  }
}

TEST_CASE("Without an optimizer below stage 3 initialize refuses, naming ZeRO inference", "[inference]") {
  tessera::nn::TinyGpt model(small_gpt_config(21));
  auto before = snapshot_parameters(*model.module());
  CHECK_THROWS_WITH(engine_for(model.module(), "train_micro_batch_size_per_gpu = 4\n[zero_optimization]\nstage = 2\n"),
                    Catch::Contains("ZeRO inference") && Catch::Contains("zero_optimization.stage = 3"));
  expect_same_parameters(snapshot_parameters(*model.module()), before);
}

TEST_CASE("A policy at stage 3 and its frozen reference as a ZeRO inference engine, in one process", "[inference]") {
  auto policy_config = [] {
    return "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\n"
           "weight_decay = 0.01\n[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = 100\n"
           "[tessera.transport]\ncollective_timeout_ms = 60000\n";
  };
  auto train = [&](bool with_reference) {
    tessera::nn::TinyGpt policy(small_gpt_config(3)), reference(small_gpt_config(3)), oracle(small_gpt_config(3));
    auto engine = engine_for(policy.module(), policy_config());
    std::shared_ptr<tessera::Engine> ref_engine;
    if (with_reference) ref_engine = engine_for(reference.module(), kInference);
    for (int step = 0; step < 3; ++step) {
      auto x = tokens(kRank, step);
      if (with_reference) {  // the reference between the policy's forward and backward
        auto loss = policy.loss(x.narrow(1, 0, 15), x.narrow(1, 1, 15));
        torch::NoGradGuard no_grad;
        CHECK(torch::equal(reference.forward(x), oracle.forward(x)));  // frozen: always the initial model
        torch::AutoGradMode grad(true);
        engine->backward(loss);
      } else {
        engine->backward(policy.loss(x.narrow(1, 0, 15), x.narrow(1, 1, 15)));
      }
      engine->step();
    }
    auto gathered = engine->gathered_parameters();
    return snapshot_parameters(*policy.module());
  };
  expect_same_parameters(train(true), train(false));
}
