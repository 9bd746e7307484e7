// What the optimizer-offload tests share: the small GPT trained at 8 sequences an update in 2
// micro-steps, the config text every one of them starts from, and the plain training loop.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine/engine.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

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

inline std::string first(const std::vector<std::string>& keys) { return keys.empty() ? "" : keys.front(); }

}  // namespace tessera::offload_testing
