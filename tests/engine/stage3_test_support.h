// What the stage-3 engine tests share: TinyGpt runs from a config text, training through
// engine.forward(), gathered snapshots, the comparison (bitwise at <= 2 ranks, relative L2 elsewhere),
// LibTorch's optimizer as the single-process oracle, and the storage-level release check
// (definitions in stage3_test_support.cpp, so this header stays free of <torch/torch.h>).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>

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
using Params = std::map<std::string, at::Tensor>;

tessera::nn::GptConfig gpt(uint64_t seed = 41);

torch::Tensor rank_loss(tessera::nn::TinyGpt& m, int step, int micro, int rank, uint64_t data_seed = 7);

// threshold < 0 leaves stage3_param_persistence_threshold out (DeepSpeed's default, 100,000).
std::string config_text(int stage, int64_t threshold = 100, int accumulation = 1, const std::string& extra = "");

std::shared_ptr<tessera::Engine> make_engine(std::shared_ptr<torch::nn::Module> m, const std::string& text,
                                             const tessera::InitializeOptions& options = {});

Params gathered_snapshot(tessera::Engine& e);

// `steps` updates of `accumulation` micro-steps, forwards through engine.forward() (torch_autocast's place).
Params train_on(tessera::Engine& e, int steps, int accumulation, const std::function<torch::Tensor(int, int)>& loss);

Params train(tessera::nn::TinyGpt& m, tessera::Engine& e, int steps, int accumulation = 1, uint64_t data_seed = 7);

Params run_gpt(int stage, int64_t threshold, int steps, int accumulation = 1, const std::string& extra = "",
               uint64_t data_seed = 7);

// Same dtype; bitwise at <= 2 ranks (or as told); each tensor's relative L2 difference <= tol everywhere.
void expect_same(const Params& actual, const Params& expected, double tol = 1e-5, bool bitwise = kWorld <= 2);

// Negative control for the comparisons: training moved every tensor.
void expect_all_changed(const Params& after, const Params& before);

// LibTorch's optimizer on every rank's gradients: backwards(step, rank) runs that rank's
// backwards into .grad; the ranks' sums are averaged as Gloo does ((g_0 + ... + g_W-1) / W).
Params oracle_run(torch::nn::Module& m, torch::optim::Optimizer& opt, int steps,
                  const std::function<void(int, int)>& backwards);

torch::optim::AdamWOptions adamw_options(double lr = 3e-3, double wd = 0.01);

// Stage 3 keeps a parameter gathered iff numel <= threshold; the others have no memory between
// steps (storage-level release) and all of it inside a gathered_parameters() scope. Releases are
// messages to the parameter-shard: a request to it (memory()) first lets it handle them.
void expect_released(tessera::Engine& e, int64_t threshold, bool released);

}  // namespace tessera::stage3_testing
