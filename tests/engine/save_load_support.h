// What the checkpoint tests (engine_save_load_test.cpp, engine_async_save_test.cpp) share: the
// models and their losses, the config, training, the exact-resume oracle and the element-by-element
// reading of stored tensors through their maps (definitions in save_load_support.cpp, so this
// header stays free of <torch/torch.h>).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/engine/engine.h"
#include "tests/engine/engine_test_support.h"

namespace tessera::transport {
class Communicator;
}

namespace tessera::save_load_testing {

using namespace tessera::engine_testing;
using tessera::CheckpointError;
using tessera::Engine;

constexpr int kGlobalBatch = 12;  // divisible by 1, 2, 3 and 4 ranks

tessera::transport::Communicator& test_comm();
void barrier();

// A directory every rank of this launch names alike, emptied by rank 0 (before a collective call).
std::string fresh_dir(const std::string& name);

// A model and its loss.
struct Trainee {
  std::shared_ptr<torch::nn::Module> module;
  std::function<at::Tensor(int step, int micro)> loss;
};

Trainee gpt(uint64_t seed = 77);
// Step 1 overflows on rank 0 in fp16: skipped on every rank.
Trainee mlp();

// Accumulation 2, AdamW with a WarmupLR schedule, at `stage`, with `precision`'s sections.
std::string config(int stage, const std::string& precision);
std::string precision_section(const std::string& dtype);  // "fp32" or "bf16"
std::shared_ptr<Engine> engine_for(const Trainee& t, const std::string& toml);
// Steps [from, to), two micro-steps each.
void train(Engine& engine, const Trainee& t, int from, int to);
void fill_nan(Engine& engine);

struct Counters {
  int64_t global, micro, skipped;
  double scale, lr;
  std::vector<double> last_lrs;
  bool operator==(const Counters& o) const {
    return global == o.global && micro == o.micro && skipped == o.skipped && scale == o.scale && lr == o.lr &&
           last_lrs == o.last_lrs;
  }
};
Counters counters(const Engine& e);

// Train 3 steps, save, train 2 more; a NaN-filled second engine loads the save, must hold its
// buffers and counters bitwise, and its 2 steps must end on the first engine's bitwise.
// Asynchronous: the writer's snapshot is held back 200 ms, so that the steps after the save run
// while it is pending (they must wait for it before the update).
void exact_resume(const std::string& name, const std::function<Trainee()>& make, const std::string& toml,
                  tessera::SaveMode mode = tessera::SaveMode::synchronous);

// Every stored tensor of `engine`, read element by element through its maps from every rank's
// buffers (all-gathered): the definition of a map, not the planner. Keys "<kind>/<name>".
std::map<std::string, at::Tensor> materialize(const Engine& engine);
std::map<std::string, at::Tensor> gathered_weights(const Engine& engine);

}  // namespace tessera::save_load_testing
