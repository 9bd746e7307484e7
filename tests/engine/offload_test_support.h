// What the offload tests share: the small GPT trained at 8 sequences an update in 2
// micro-steps, the config text every one of them starts from, the plain training loop, shared
// directories, and the comparisons (same buffers, resume as one run, the negative control).
#pragma once

#include <torch/nn/module.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/storage_snapshot.h"
#include "tests/engine/test_communicator.h"

namespace tessera::offload_testing {

using engine_testing::kRank;
using engine_testing::kWorld;

inline constexpr int kGlobalBatch = 8;  // divisible by 1, 2 and 4 ranks
inline constexpr int kAccumulation = 2;

inline const char* const kBf16 = "[bf16]\nenabled = true\n";
inline const char* const kBf16Masters = "[bf16]\nenabled = true\nbf16_master_weights_and_grads = true\n"
                                        "bf16_optimizer_states = true\n";

struct Trainee {
  std::shared_ptr<nn::TinyGpt> gpt;
  uint64_t stream = 0;  // which of the corpus's batch sequences it trains on
  torch::Tensor loss(int step, int micro, int rank) const {
    auto batch = engine_testing::corpus().batch(stream, step, micro, kGlobalBatch, 16, rank, kWorld);
    return gpt->loss(batch.tokens, batch.targets);
  }
};

inline Trainee make_trainee(uint64_t seed, uint64_t stream) {
  return {std::make_shared<nn::TinyGpt>(engine_testing::small_gpt_config(seed)), stream};
}

// The whole config: `top_level` keys and sections before the optimizer (clipping, precision),
// AdamW with `adamw_weight_decay` (none: a client optimizer is given instead), ZeRO `stage` with
// sub-groups of 1000 elements and buckets of 3000 (several of each per partition, so staging slots
// are reused), then `offload_sections`.
inline std::string offload_config(int stage, const std::string& top_level, std::optional<double> adamw_weight_decay,
                                  const std::string& offload_sections) {
  return "train_micro_batch_size_per_gpu = " + std::to_string(kGlobalBatch / kWorld) +
         "\ngradient_accumulation_steps = " + std::to_string(kAccumulation) + "\n" + top_level +
         (adamw_weight_decay ? "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = " +
                                   std::to_string(*adamw_weight_decay) + "\n"
                             : std::string()) +
         "[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nreduce_bucket_size = 3000\nsub_group_size = 1000\nstage3_param_persistence_threshold = 100\n" +
         offload_sections + "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

// Updates [from, to), each of kAccumulation micro-steps; the losses of every micro-step.
inline std::vector<double> train(Engine& engine, const Trainee& t, int from, int to) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step)
    for (int micro = 0; micro < kAccumulation; ++micro) {
      auto loss = t.loss(step, micro, kRank);
      engine.backward(loss);
      engine.step();
      losses.push_back(loss.item<double>());
    }
  return losses;
}

// An engine for `t` from TOML text; `source` names the text in errors.
inline std::shared_ptr<Engine> engine_from_toml(const Trainee& t, const std::string& toml, const std::string& source,
                                                const InitializeOptions& options = {}) {
  return initialize(t.gpt->module(), config::load_config_text(toml, config::Format::toml, source), options).engine;
}

// initialize() refuses `toml` for `t` with an error naming `key` and saying `words`.
inline void expect_refused(const Trainee& t, const std::string& toml, const std::string& key, const std::string& words,
                           const InitializeOptions& options = {}) {
  try {
    engine_from_toml(t, toml, "refused_test", options);
    FAIL("accepted: " << toml);
  } catch (const Error& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find(key) != std::string::npos);
    CHECK(std::string(e.what()).find(words) != std::string::npos);
  }
}

inline std::string first(const std::vector<std::string>& keys) { return keys.empty() ? "" : keys.front(); }

// Every stored buffer of two engines bitwise equal (the first differing one named).
inline void expect_same_buffers(const Engine& a, const Engine& b) {
  const auto diff = engine_testing::differing(engine_testing::buffers(a), engine_testing::buffers(b));
  INFO(diff.size() << " buffers differ, first " << first(diff));
  CHECK(diff.empty());
}

// A directory every rank of this launch names alike (<prefix>_<job>_<name> under the temp
// directory), emptied by rank 0 after every rank is done with what it held there (Catch runs a
// test case again for each section, and a section may end on one rank before another has read
// its file) and before anyone uses it.
inline std::string fresh_shared_dir(transport::Communicator& comm, const std::string& prefix, const std::string& name) {
  namespace fs = std::filesystem;
  const auto dir = fs::temp_directory_path() / (prefix + "_" + engine_testing::env_string("TESSERA_JOB", "solo") + "_" + name);
  if (kWorld > 1) comm.barrier()->wait();
  if (kRank == 0) fs::remove_all(dir);
  if (kWorld > 1) comm.barrier()->wait();
  fs::create_directories(dir);
  return dir.string();
}

using EngineMaker = std::function<std::shared_ptr<Engine>(const Trainee&)>;  // an engine for a trainee

// The negative control: two engines for two fresh trainees, 2 updates each; some buffer must differ.
inline void expect_training_differs(const std::function<Trainee()>& make, const EngineMaker& a,
                                    const EngineMaker& b) {
  auto ta = make(), tb = make();
  auto ea = a(ta), eb = b(tb);
  train(*ea, ta, 0, 2);
  train(*eb, tb, 0, 2);
  CHECK_FALSE(engine_testing::differing(engine_testing::buffers(*ea), engine_testing::buffers(*eb)).empty());
}

// Checkpoints as one uninterrupted run: an engine made by `saver` trains 4 updates; another trains
// 2 and saves into `dir`; one made by `loader` for a fresh trainee loads it and trains updates 2-3.
// Its buffers and step count must be the uninterrupted run's.
inline void expect_resume_as_uninterrupted(const std::function<Trainee()>& make, const EngineMaker& saver,
                                           const EngineMaker& loader, const std::string& dir) {
  auto whole = make();
  auto uninterrupted = saver(whole);
  train(*uninterrupted, whole, 0, 4);
  auto part = make();
  auto first_half = saver(part);
  train(*first_half, part, 0, 2);
  first_half->save_checkpoint(dir);
  auto rest = make();
  auto second_half = loader(rest);
  second_half->load_checkpoint(dir);
  train(*second_half, rest, 2, 4);
  expect_same_buffers(*uninterrupted, *second_half);
  CHECK(uninterrupted->global_steps() == second_half->global_steps());
}

}  // namespace tessera::offload_testing
