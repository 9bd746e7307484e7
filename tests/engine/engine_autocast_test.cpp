// torch_autocast: forward under LibTorch's CPU autocast in bf16 with fp32 weights, and the
// gradients of lower_precision_safe_modules (Linear by default) reduced in bf16, against a
// single-process oracle that runs each rank's forward under autocast itself and rounds those
// gradients to bf16 before and after averaging (Gloo sums bf16 in fp32 and rounds once). At
// stage 3 the Linear units are gathered in bf16 for forwards under autocast (fewer bytes, the
// same results) and exactly for anything else.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include "actors/engine/autocast.h"
#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

tessera::nn::GptConfig small_gpt() { return small_gpt_config(31); }

std::string config(int stage, bool autocast) {
  std::string c = "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) +
                  "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
                  "[zero_optimization]\nstage = " + std::to_string(stage) + "\nreduce_bucket_size = 4000\n"
                  "stage3_param_persistence_threshold = 100\n";
  if (autocast) c += "[torch_autocast]\nenabled = true\ndtype = \"bfloat16\"\n";
  return c;
}

torch::Tensor rank_loss(tessera::nn::TinyGpt& model, int step, int rank) {
  auto b = corpus().batch(3, step, 0, 8, 16, rank, kWorld);
  return model.loss(b.tokens, b.targets);
}

bool owned_by_linear(const std::string& name) {
  for (const char* linear : {"c_attn", "c_proj", "c_fc", "lm_head"})
    if (name.find(linear) != std::string::npos) return true;
  return false;
}

// The oracle; `bf16_comm` = false gives the negative control (Linear gradients reduced in fp32).
std::map<std::string, torch::Tensor> oracle(int steps, bool bf16_comm) {
  tessera::nn::TinyGpt model(small_gpt());
  auto named = model.module()->named_parameters();
  std::vector<torch::Tensor> params;
  std::vector<bool> low;
  for (auto& item : named) params.push_back(item.value()), low.push_back(owned_by_linear(item.key()));
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      torch::Tensor loss;
      {
        at::autocast::set_cpu_enabled(true);
        at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
        loss = rank_loss(model, step, rank);
        at::autocast::set_cpu_enabled(false);
        at::autocast::clear_cache();
      }
      loss.backward();
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad().clone();
        if (bf16_comm && low[i]) g = g.to(torch::kBFloat16).to(torch::kFloat);
        sums[i] = rank == 0 ? g : sums[i].add_(g);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      auto g = sums[i].div_(kWorld);
      if (bf16_comm && low[i]) g = g.to(torch::kBFloat16).to(torch::kFloat);
      params[i].mutable_grad() = g;
    }
    optimizer.step();
  }
  return snapshot_parameters(*model.module());
}

}  // namespace

TEST_CASE("Linear modules are the lower-precision-safe ones; names in DeepSpeed's and LibTorch's spelling",
          "[engine][autocast]") {
  tessera::nn::TinyGpt model(small_gpt());
  std::vector<std::string> names;
  for (auto& item : model.module()->named_parameters()) names.push_back(item.key());
  for (const auto& spelling : {"torch.nn.Linear", "torch::nn::Linear", "torch::nn::LinearImpl"}) {
    INFO(spelling);
    const auto low = tessera::actors::lower_precision_parameters(*model.module(), names, {spelling});
    for (size_t i = 0; i < names.size(); ++i) CHECK(low[i] == owned_by_linear(names[i]));
  }
  const auto none = tessera::actors::lower_precision_parameters(*model.module(), names, {"torch.nn.Conv2d"});
  for (bool b : none) CHECK_FALSE(b);
  // LayerNorm's parameters follow when named.
  const auto ln = tessera::actors::lower_precision_parameters(*model.module(), names, {"LayerNorm"});
  for (size_t i = 0; i < names.size(); ++i) CHECK(ln[i] == (names[i].find("ln_") != std::string::npos));
}

TEST_CASE("Autocast training equals the oracle at stages 0/1/2/3; fp32 reduction of Linear grads does not",
          "[engine][autocast]") {
  const int steps = 4;
  const auto expected = oracle(steps, true);
  const auto control = oracle(steps, false);
  for (int stage : {0, 1, 2, 3}) {
    INFO("stage " << stage);
    tessera::nn::TinyGpt model(small_gpt());
    auto engine =
        tessera::initialize(model.module(), tessera::config::load_config_text(config(stage, true), tessera::config::Format::toml, "a"))
            .engine;
    for (int step = 0; step < steps; ++step) {
      auto loss = engine->forward([&] {
        CHECK(at::autocast::is_cpu_enabled());
        CHECK(at::autocast::get_autocast_cpu_dtype() == at::kBFloat16);
        return rank_loss(model, step, kRank);
      });
      CHECK_FALSE(at::autocast::is_cpu_enabled());
      if (stage == 3 && step > 0) {
        // lm_head stays gathered for its backward (stage3_max_reuse_distance), in bf16 values.
        const auto w = model.module()->named_parameters()["lm_head.weight"];
        REQUIRE(w.storage().nbytes() > 0);
        CHECK(torch::equal(w, w.to(torch::kBFloat16).to(torch::kFloat)));
      }
      engine->backward(loss);
      engine->step();
    }
    std::map<std::string, torch::Tensor> got;
    {
      auto gathered = engine->gathered_parameters();  // stage 3: exact values, not the bf16 ones
      got = snapshot_parameters(*model.module());
    }
    expect_same_parameters(got, expected);
    // Negative control: with more than one rank, reducing the Linear gradients in fp32 gives other bits.
    if (kWorld == 2) {
      bool differs = false;
      for (const auto& [name, p] : control) differs = differs || !torch::equal(p, got.at(name));
      CHECK(differs);
    }
  }
}

TEST_CASE("Stage 3 gathers Linear units in bf16 only for forwards under autocast and their backwards",
          "[engine][autocast]") {
  auto run = [](bool autocast, bool with_plain_forward) {
    tessera::nn::TinyGpt model(small_gpt());
    auto engine = tessera::initialize(model.module(), tessera::config::load_config_text(config(3, autocast),
                                                                                       tessera::config::Format::toml, "a"))
                      .engine;
    for (int step = 0; step < 3; ++step) {
      auto loss = engine->forward([&] { return rank_loss(model, step, kRank); });
      if (with_plain_forward && step == 2) {
        // A no-grad forward without autocast between the forward and its backward: lm_head, still
        // gathered in bf16 for that backward, is gathered again exactly (logits as a plain model's).
        std::map<std::string, torch::Tensor> weights;
        {
          auto gathered = engine->gathered_parameters();
          weights = snapshot_parameters(*model.module());
        }
        tessera::nn::TinyGpt plain(small_gpt());
        {
          torch::NoGradGuard no_grad;
          for (auto& item : plain.module()->named_parameters()) item.value().copy_(weights.at(item.key()));
          auto b = corpus().batch(3, 9, 0, 8, 16, kRank, kWorld);
          CHECK(torch::equal(model.forward(b.tokens), plain.forward(b.tokens)));
        }
      }
      engine->backward(loss);
      engine->step();
    }
    return engine->stage3_stats();
  };
  const auto fp32 = run(false, false), bf16 = run(true, false);
  INFO("gathered wire bytes: without autocast " << fp32.gathered_wire_bytes << ", with " << bf16.gathered_wire_bytes);
  CHECK(fp32.fetches == bf16.fetches);
  CHECK(bf16.gathered_wire_bytes < fp32.gathered_wire_bytes * 3 / 4);  // the Linear units are most of the model
  CHECK(bf16.gathered_wire_bytes > fp32.gathered_wire_bytes / 2);      // the embeddings still travel in fp32
  run(true, true);
}

TEST_CASE("Without torch_autocast, forward() switches an outer autocast off inside", "[engine][autocast]") {
  tessera::nn::TinyGpt model(small_gpt());
  auto engine =
      tessera::initialize(model.module(), tessera::config::load_config_text(config(1, false), tessera::config::Format::toml, "a"))
          .engine;
  at::autocast::set_cpu_enabled(true);
  CHECK_FALSE(engine->forward([] { return at::autocast::is_cpu_enabled(); }));
  CHECK(at::autocast::is_cpu_enabled());
  at::autocast::set_cpu_enabled(false);
  CHECK_THROWS_WITH(
      tessera::initialize(model.module(), tessera::config::load_config_text(
                                              config(1, false) + "[torch_autocast]\nenabled = true\ndtype = \"float16\"\n",
                                              tessera::config::Format::toml, "a")),
      Catch::Contains("torch_autocast.dtype") && Catch::Contains("bfloat16"));
}
