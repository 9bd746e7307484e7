// Activation checkpointing (core/nn/activation_checkpoint.h) against the same model without it:
// gradients of one backward bitwise (no engine), and training at stages 0, 2 and 3 bitwise at 2
// ranks (relative L2 <= 1e-5 at 4). At stage 3 the recomputation inside backward gathers the
// blocks' units again through their holders.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/activation_checkpoint.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

tessera::nn::GptConfig gpt(bool checkpoint) {
  auto c = small_gpt_config(41);
  c.checkpoint_blocks = checkpoint;
  return c;
}

std::map<std::string, torch::Tensor> train(bool checkpoint, int stage) {
  tessera::nn::TinyGpt model(gpt(checkpoint));
  const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) +
                           "\ngradient_accumulation_steps = 2\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\n"
                           "lr = 3e-3\nweight_decay = 0.01\n[zero_optimization]\nstage = " + std::to_string(stage) +
                           "\nreduce_bucket_size = 5000\nstage3_param_persistence_threshold = 100\n"
                           "[tessera.transport]\ncollective_timeout_ms = 60000\n";
  auto engine =
      tessera::initialize(model.module(), tessera::config::load_config_text(toml, tessera::config::Format::toml, "ckpt")).engine;
  for (int step = 0; step < 4; ++step)
    for (int micro = 0; micro < 2; ++micro) {
      auto batch = corpus().batch(13, step, micro, 8, 16, kRank, kWorld);
      engine->backward(model.loss(batch.tokens, batch.targets));
      engine->step();
    }
  auto gathered = engine->gathered_parameters();
  return snapshot_parameters(*model.module());
}

}  // namespace

TEST_CASE("A checkpointed block's gradients equal the plain block's, bitwise; it runs twice", "[checkpoint]") {
  torch::manual_seed(3);
  auto block = torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::GELU(), torch::nn::Linear(16, 8));
  auto x = torch::randn({4, 8}, torch::requires_grad());
  auto plain_out = block->forward(x);
  plain_out.pow(2).sum().backward();
  std::vector<torch::Tensor> plain;
  for (auto& p : block->parameters()) plain.push_back(p.grad().clone()), p.mutable_grad() = torch::Tensor();
  auto plain_x = x.grad().clone();
  x.mutable_grad() = torch::Tensor();
  int calls = 0;
  auto out = tessera::nn::checkpoint(*block, [&](const at::Tensor& h) { ++calls; return block->forward(h); }, x);
  CHECK(calls == 1);
  CHECK(torch::equal(out, plain_out));
  REQUIRE(out.grad_fn());
  INFO("grad_fn " << out.grad_fn()->name());
  CHECK(out.grad_fn()->next_edges().size() == 1 + 4);  // x and the 4 parameters: the block's graph was not kept
  out.pow(2).sum().backward();
  CHECK(calls == 2);  // recomputed in backward
  CHECK(torch::equal(x.grad(), plain_x));
  size_t i = 0;
  for (auto& p : block->parameters()) CHECK(torch::equal(p.grad(), plain[i++]));
  // Under no_grad it is a plain call.
  torch::NoGradGuard no_grad;
  CHECK(torch::equal(tessera::nn::checkpoint(*block, [&](const at::Tensor& h) { return block->forward(h); }, x), plain_out));
}

TEST_CASE("Training with checkpointed blocks equals training without, at stages 0, 2 and 3", "[checkpoint]") {
  for (int stage : {0, 2, 3}) {
    INFO("stage " << stage << " world " << kWorld);
    expect_same_parameters(train(true, stage), train(false, stage));
  }
}
