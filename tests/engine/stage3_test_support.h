// What the stage-3 engine tests share: TinyGpt runs from a config text, training through
// engine.forward(), gathered snapshots, the comparison (bitwise at <= 2 ranks, relative L2 elsewhere),
// LibTorch's optimizer as the single-process oracle, and the storage-level release check.
#pragma once

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace tessera::stage3_testing {

using namespace tessera::engine_testing;
using Params = std::map<std::string, torch::Tensor>;

inline tessera::nn::GptConfig gpt(uint64_t seed = 41) { return small_gpt_config(seed); }

inline torch::Tensor rank_loss(tessera::nn::TinyGpt& m, int step, int micro, int rank, uint64_t data_seed = 7) {
  auto b = corpus().batch(data_seed, step, micro, 8, 16, rank, kWorld);
  return m.loss(b.tokens, b.targets);
}

// threshold < 0 leaves stage3_param_persistence_threshold out (DeepSpeed's default, 100,000).
inline std::string config_text(int stage, int64_t threshold = 100, int accumulation = 1, const std::string& extra = "") {
  std::string c = "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) + "\ngradient_accumulation_steps = " +
                  std::to_string(accumulation) + "\n" + extra +
                  "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
                  "[zero_optimization]\nstage = " + std::to_string(stage) + "\nreduce_bucket_size = 3000\n";
  if (stage == 3 && threshold >= 0) c += "stage3_param_persistence_threshold = " + std::to_string(threshold) + "\n";
  return c + "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

inline std::shared_ptr<tessera::Engine> make_engine(std::shared_ptr<torch::nn::Module> m, const std::string& text,
                                             const tessera::InitializeOptions& options = {}) {
  auto config = tessera::config::load_config_text(text, tessera::config::Format::toml, "stage3_test");
  return tessera::initialize(std::move(m), config, options).engine;
}

inline Params gathered_snapshot(tessera::Engine& e) {
  auto scope = e.gathered_parameters();
  return snapshot_parameters(*e.module());
}

// `steps` updates of `accumulation` micro-steps, forwards through engine.forward() (torch_autocast's place).
inline Params train_on(tessera::Engine& e, int steps, int accumulation, const std::function<torch::Tensor(int, int)>& loss) {
  for (int step = 0; step < steps; ++step)
    for (int micro = 0; micro < accumulation; ++micro) {
      e.backward(e.forward([&] { return loss(step, micro); }));
      e.step();
    }
  return gathered_snapshot(e);
}

inline Params train(tessera::nn::TinyGpt& m, tessera::Engine& e, int steps, int accumulation = 1, uint64_t data_seed = 7) {
  return train_on(e, steps, accumulation,
                  [&](int step, int micro) { return rank_loss(m, step, micro, kRank, data_seed); });
}

inline Params run_gpt(int stage, int64_t threshold, int steps, int accumulation = 1, const std::string& extra = "",
               uint64_t data_seed = 7) {
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(stage, threshold, accumulation, extra));
  return train(m, *e, steps, accumulation, data_seed);
}

// Same dtype; bitwise at <= 2 ranks (or as told); each tensor's relative L2 difference <= tol everywhere.
inline void expect_same(const Params& actual, const Params& expected, double tol = 1e-5, bool bitwise = kWorld <= 2) {
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

// Negative control for the comparisons: training moved every tensor.
inline void expect_all_changed(const Params& after, const Params& before) {
  for (const auto& [name, p] : before) {
    INFO(name);
    CHECK_FALSE(torch::equal(p, after.at(name)));
  }
}

// LibTorch's optimizer on every rank's gradients: backwards(step, rank) runs that rank's
// backwards into .grad; the ranks' sums are averaged as Gloo does ((g_0 + ... + g_W-1) / W).
inline Params oracle_run(torch::nn::Module& m, torch::optim::Optimizer& opt, int steps,
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

inline torch::optim::AdamWOptions adamw_options(double lr = 3e-3, double wd = 0.01) {
  return torch::optim::AdamWOptions(lr).weight_decay(wd);
}

// Stage 3 keeps a parameter gathered iff numel <= threshold; the others have no memory between
// steps (storage-level release) and all of it inside a gathered_parameters() scope. Releases are
// messages to the parameter-shard: a request to it (memory()) first lets it handle them.
inline void expect_released(tessera::Engine& e, int64_t threshold, bool released) {
  (void)e.memory();
  for (auto& item : e.module()->named_parameters()) {
    INFO(item.key() << " (" << item.value().numel() << " elements) nbytes " << item.value().storage().nbytes());
    if (released && item.value().numel() > threshold) CHECK(item.value().storage().nbytes() == 0);
    else CHECK(item.value().storage().nbytes() > 0);
  }
}

}  // namespace tessera::stage3_testing
