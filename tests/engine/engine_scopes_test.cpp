// no_sync, coalesce_grad_reduction, several engines in one process and a joint loss with a plain
// loss.backward(), against single-process oracles (bitwise at 2 ranks, relative L2 <= 1e-5 at 4).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <map>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

std::shared_ptr<tessera::nn::TinyGpt> make_gpt(uint64_t seed = 77) {
  tessera::nn::GptConfig c;
  c.d_model = 32, c.n_layer = 1, c.n_head = 2, c.context = 16, c.seed = seed;
  return std::make_shared<tessera::nn::TinyGpt>(c);
}

torch::Tensor loss_of(tessera::nn::TinyGpt& m, int step, int chunk, int rank, uint64_t seed = 5) {
  auto b = corpus().batch(seed, step, chunk, 4 * kWorld, 16, rank, kWorld);
  return m.loss(b.tokens, b.targets);
}

std::string toml(int stage, int accumulation = 1) {
  return "train_micro_batch_size_per_gpu = 4\ngradient_accumulation_steps = " + std::to_string(accumulation) +
         "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) + "\noverlap_comm = true\nreduce_bucket_size = 2000\n";
}

std::shared_ptr<tessera::Engine> make_engine(tessera::nn::TinyGpt& m, int stage, int accumulation = 1) {
  return tessera::initialize(m.module(), tessera::config::load_config_text(toml(stage, accumulation),
                                                                           tessera::config::Format::toml, "scopes"))
      .engine;
}

using Params = std::map<std::string, torch::Tensor>;
// Oracle: per step, every rank's summed gradient over `chunks` backwards of loss(step, chunk) *
// weight, averaged over ranks as Gloo does ((sum over ranks) / W), then AdamW.
Params oracle(int steps, int chunks, uint64_t model_seed = 77, uint64_t data_seed = 5) {
  auto m = make_gpt(model_seed);
  auto params = m->module()->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      for (int chunk = 0; chunk < chunks; ++chunk) loss_of(*m, step, chunk, rank, data_seed).backward();
      for (size_t i = 0; i < params.size(); ++i)
        sums[i] = rank == 0 ? params[i].grad().clone() : sums[i].add_(params[i].grad());
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i].div_(kWorld);
    opt.step();
  }
  return snapshot_parameters(*m->module());
}

}  // namespace

TEST_CASE("coalesce_grad_reduction: three backwards, one reduction, equal to the oracle", "[engine][scopes]") {
  const auto expected = oracle(3, 3);
  for (int stage : {0, 1, 2}) {
    INFO("stage " << stage);
    auto m = make_gpt();
    auto engine = make_engine(*m, stage);
    for (int step = 0; step < 3; ++step) {
      {
        auto block = engine->coalesce_grad_reduction();
        for (int chunk = 0; chunk < 3; ++chunk) engine->backward(loss_of(*m, step, chunk, kRank));
        CHECK_THROWS_WITH(engine->step(), Catch::Contains("inside coalesce_grad_reduction"));
        CHECK_THROWS_WITH(engine->no_sync(), Catch::Contains("inside coalesce_grad_reduction"));
      }
      engine->step();
    }
    expect_same_parameters(snapshot_parameters(*m->module()), expected);
  }
}

TEST_CASE("no_sync over two micro-steps then a reducing backward equals accumulation (stage 2 too)",
          "[engine][scopes]") {
  const auto expected = oracle(2, 3);
  for (int stage : {1, 2}) {
    INFO("stage " << stage);
    auto m = make_gpt();
    auto engine = make_engine(*m, stage);
    for (int step = 0; step < 2; ++step) {
      {
        auto block = engine->no_sync();
        engine->backward(loss_of(*m, step, 0, kRank));
        engine->backward(loss_of(*m, step, 1, kRank));
        CHECK_THROWS_WITH(engine->step(), Catch::Contains("inside no_sync"));
        CHECK_THROWS_WITH(engine->coalesce_grad_reduction(), Catch::Contains("nested inside no_sync"));
      }
      engine->backward(loss_of(*m, step, 2, kRank));
      engine->step();
    }
    expect_same_parameters(snapshot_parameters(*m->module()), expected);
  }
}

TEST_CASE("Two engines in one process train independently like two single-engine runs", "[engine][multi]") {
  const auto expected_a = oracle(3, 1, 77, 5), expected_b = oracle(3, 1, 91, 6);
  auto a = make_gpt(77), b = make_gpt(91);
  auto engine_a = make_engine(*a, 2), engine_b = make_engine(*b, 1);
  for (int step = 0; step < 3; ++step) {
    engine_a->backward(loss_of(*a, step, 0, kRank, 5));
    engine_b->backward(loss_of(*b, step, 0, kRank, 6));
    engine_a->step();
    engine_b->step();
  }
  expect_same_parameters(snapshot_parameters(*a->module()), expected_a);
  expect_same_parameters(snapshot_parameters(*b->module()), expected_b);
}

TEST_CASE("A joint loss over two engines with a plain loss.backward() is reduced and stepped", "[engine][multi]") {
  // Oracle: both models' gradients of L = l_a + l_b / 2 per rank, averaged over ranks, AdamW each.
  auto oa = make_gpt(77), ob = make_gpt(91);
  auto pa = oa->module()->parameters(), pb = ob->module()->parameters();
  torch::optim::AdamW opt_a(pa, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  torch::optim::AdamW opt_b(pb, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  std::vector<torch::Tensor> all = pa;
  all.insert(all.end(), pb.begin(), pb.end());
  for (int step = 0; step < 3; ++step) {
    std::vector<torch::Tensor> sums(all.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : all) p.mutable_grad() = torch::Tensor();
      (loss_of(*oa, step, 0, rank) + loss_of(*ob, step, 0, rank) / 2).backward();
      for (size_t i = 0; i < all.size(); ++i) sums[i] = rank == 0 ? all[i].grad().clone() : sums[i].add_(all[i].grad());
    }
    for (size_t i = 0; i < all.size(); ++i) all[i].mutable_grad() = sums[i].div_(kWorld);
    opt_a.step();
    opt_b.step();
  }
  auto a = make_gpt(77), b = make_gpt(91);
  auto engine_a = make_engine(*a, 2), engine_b = make_engine(*b, 0);
  for (int step = 0; step < 3; ++step) {
    (loss_of(*a, step, 0, kRank) + loss_of(*b, step, 0, kRank) / 2).backward();
    engine_a->step();
    engine_b->step();
  }
  expect_same_parameters(snapshot_parameters(*a->module()), snapshot_parameters(*oa->module()));
  expect_same_parameters(snapshot_parameters(*b->module()), snapshot_parameters(*ob->module()));
}

TEST_CASE("Two plain backwards in one boundary micro-step are refused at step()", "[engine][scopes]") {
  auto m = make_gpt();
  auto engine = make_engine(*m, 1);
  loss_of(*m, 0, 0, kRank).backward();
  loss_of(*m, 0, 1, kRank).backward();
  CHECK_THROWS_WITH(engine->step(), Catch::Contains("coalesce_grad_reduction"));
  engine->zero_grad();
  engine->backward(loss_of(*m, 0, 0, kRank));
  engine->step();
  CHECK(engine->global_steps() == 1);
}
