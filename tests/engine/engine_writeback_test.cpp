// gathered_parameters() with a modifier rank (DeepSpeed's GatheredParameters(modifier_rank=...)) at
// ZeRO-3: the modifier's changes to a partitioned weight (lm_head) and a persistent one (ln_f) are
// broadcast when the scope ends and written into every rank's partitions and fp32 masters; the
// other ranks' changes are dropped. Oracle: the same model with the change made before
// initialize, trained alike (bitwise at <= 2 ranks). Negative control: without a modifier rank
// the changes are lost.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

std::string toml(bool bf16) {
  return "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) +
         "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n" +
         (bf16 ? "[bf16]\nenabled = true\n" : "") +
         "[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = 100\n"
         "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

void change(torch::nn::Module& m, bool modifier) {
  torch::NoGradGuard no_grad;
  auto p = m.named_parameters();
  p["lm_head.weight"].fill_(modifier ? 0.5 : -7.0);  // bf16-exact
  p["ln_f.weight"].fill_(modifier ? 2.0 : -3.0);
}

std::map<std::string, torch::Tensor> train(tessera::nn::TinyGpt& model, tessera::Engine& engine) {
  for (int step = 0; step < 3; ++step) {
    auto batch = corpus().batch(17, step, 0, 8, 16, kRank, kWorld);
    engine.backward(model.loss(batch.tokens, batch.targets));
    engine.step();
  }
  auto gathered = engine.gathered_parameters();
  return snapshot_parameters(*model.module());
}

std::shared_ptr<tessera::Engine> make(tessera::nn::TinyGpt& model, bool bf16) {
  return tessera::initialize(model.module(), tessera::config::load_config_text(toml(bf16), tessera::config::Format::toml, "wb"))
      .engine;
}

}  // namespace

TEST_CASE("A modifier rank's changes reach every rank's partitions and masters; without one they are lost",
          "[writeback]") {
  const int modifier = kWorld - 1;
  for (bool bf16 : {false, true}) {
    INFO((bf16 ? "bf16 with fp32 master" : "fp32") << ", world " << kWorld);
    tessera::nn::TinyGpt model(small_gpt_config(8)), oracle(small_gpt_config(8));
    auto engine = make(model, bf16);
    std::map<std::string, torch::Tensor> before;
    {
      auto scope = engine->gathered_parameters();
      before = snapshot_parameters(*model.module());
    }
    {  // negative control: changed everywhere, no modifier rank
      auto scope = engine->gathered_parameters({"lm_head.weight", "ln_f.weight"});
      change(*model.module(), true);
    }
    {
      auto scope = engine->gathered_parameters();
      expect_same_parameters(snapshot_parameters(*model.module()), before);
    }
    {
      auto scope = engine->gathered_parameters({"lm_head.weight", "ln_f.weight"}, modifier);
      change(*model.module(), kRank == modifier);
    }
    {
      auto scope = engine->gathered_parameters({"lm_head.weight"});
      auto p = model.module()->named_parameters();
      CHECK((p["lm_head.weight"] == 0.5).all().item<bool>());
      CHECK((p["ln_f.weight"] == 2.0).all().item<bool>());
    }
    change(*oracle.module(), true);
    auto oracle_engine = make(oracle, bf16);
    expect_same_parameters(train(model, *engine), train(oracle, *oracle_engine));
  }
  tessera::nn::TinyGpt model(small_gpt_config(8));
  auto engine = make(model, false);
  CHECK_THROWS_WITH(engine->gathered_parameters({}, kWorld), Catch::Contains("modifier rank"));
}

TEST_CASE("Ranks naming different modifier ranks get an error from close() or the next call; nothing changes",
          "[writeback]") {
  if (kWorld < 2) return;  // one rank cannot disagree with itself
  tessera::nn::TinyGpt model(small_gpt_config(8)), oracle(small_gpt_config(8));
  auto engine = make(model, false);
  auto oracle_engine = make(oracle, false);
  {
    auto scope = engine->gathered_parameters({"lm_head.weight", "ln_f.weight"}, kRank);  // every rank names itself
    change(*model.module(), true);
    CHECK_THROWS_WITH(scope.close(), Catch::Contains("different modifier ranks") && Catch::Contains("rank 1 names 1") &&
                                         Catch::Contains("nothing was changed"));
  }
  {
    auto scope = engine->gathered_parameters({"lm_head.weight", "ln_f.weight"}, kRank);
    change(*model.module(), true);
  }  // the destructor cannot raise: the next call does, once
  CHECK_THROWS_WITH(engine->gathered_parameters(), Catch::Contains("different modifier ranks"));
  // Nothing was changed (partitions, masters, persistent copies): training equals the untouched oracle's.
  expect_same_parameters(train(model, *engine), train(oracle, *oracle_engine));
}
