#include "tests/engine/stage3_test_support.h"

#include <catch2/catch.hpp>
#include <torch/torch.h>

namespace tessera::stage3_testing {

tessera::nn::GptConfig gpt(uint64_t seed) { return small_gpt_config(seed); }

torch::Tensor rank_loss(tessera::nn::TinyGpt& m, int step, int micro, int rank, uint64_t data_seed) {
  auto b = corpus().batch(data_seed, step, micro, 8, 16, rank, kWorld);
  return m.loss(b.tokens, b.targets);
}

std::string config_text(int stage, int64_t threshold, int accumulation, const std::string& extra) {
  std::string c = "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) + "\ngradient_accumulation_steps = " +
                  std::to_string(accumulation) + "\n" + extra +
                  "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
                  "[zero_optimization]\nstage = " + std::to_string(stage) + "\nreduce_bucket_size = 3000\n";
  if (stage == 3 && threshold >= 0) c += "stage3_param_persistence_threshold = " + std::to_string(threshold) + "\n";
  return c + "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

std::shared_ptr<tessera::Engine> make_engine(std::shared_ptr<torch::nn::Module> m, const std::string& text,
                                             const tessera::InitializeOptions& options) {
  auto config = tessera::config::load_config_text(text, tessera::config::Format::toml, "stage3_test");
  return tessera::initialize(std::move(m), config, options).engine;
}

Params gathered_snapshot(tessera::Engine& e) {
  auto scope = e.gathered_parameters();
  return snapshot_parameters(*e.module());
}

Params train_on(tessera::Engine& e, int steps, int accumulation, const std::function<torch::Tensor(int, int)>& loss) {
  for (int step = 0; step < steps; ++step)
    for (int micro = 0; micro < accumulation; ++micro) {
      e.backward(e.forward([&] { return loss(step, micro); }));
      e.step();
    }
  return gathered_snapshot(e);
}

Params train(tessera::nn::TinyGpt& m, tessera::Engine& e, int steps, int accumulation, uint64_t data_seed) {
  return train_on(e, steps, accumulation,
                  [&](int step, int micro) { return rank_loss(m, step, micro, kRank, data_seed); });
}

Params run_gpt(int stage, int64_t threshold, int steps, int accumulation, const std::string& extra,
               uint64_t data_seed) {
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(stage, threshold, accumulation, extra));
  return train(m, *e, steps, accumulation, data_seed);
}

void expect_same(const Params& actual, const Params& expected, double tol, bool bitwise) {
  REQUIRE(actual.size() == expected.size());
  for (const auto& [name, p] : expected) {
    const auto& q = actual.at(name);
    const auto a = p.to(torch::kFloat), b = q.to(torch::kFloat);
    INFO(name << " max |diff| " << (a - b).abs().max().item<double>());
    CHECK(q.scalar_type() == p.scalar_type());
    if (bitwise) CHECK(torch::equal(p, q));
    CHECK((a - b).norm().item<double>() <= tol * a.norm().item<double>());
  }
}

void expect_all_changed(const Params& after, const Params& before) {
  for (const auto& [name, p] : before) {
    INFO(name);
    CHECK_FALSE(torch::equal(p, after.at(name)));
  }
}

Params oracle_run(torch::nn::Module& m, torch::optim::Optimizer& opt, int steps,
                  const std::function<void(int, int)>& backwards) {
  auto params = m.parameters();
  for (int step = 0; step < steps; ++step) {
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      backwards(step, rank);
      for (size_t i = 0; i < params.size(); ++i)
        sums[i] = rank == 0 ? params[i].grad().clone() : sums[i].add_(params[i].grad());
    }
    for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i].div_(kWorld);
    opt.step();
  }
  return snapshot_parameters(m);
}

torch::optim::AdamWOptions adamw_options(double lr, double wd) {
  return torch::optim::AdamWOptions(lr).weight_decay(wd);
}

void expect_released(tessera::Engine& e, int64_t threshold, bool released) {
  (void)e.memory();
  for (auto& item : e.module()->named_parameters()) {
    INFO(item.key() << " (" << item.value().numel() << " elements) nbytes " << item.value().storage().nbytes());
    if (released && item.value().numel() > threshold) CHECK(item.value().storage().nbytes() == 0);
    else CHECK(item.value().storage().nbytes() > 0);
  }
}

}  // namespace tessera::stage3_testing
