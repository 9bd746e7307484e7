// RolloutEngine is the generation side of the RL loop: one job under tessera-launch whose ranks
// are one tensor-parallel group (TP size = the job's world size), running a Llama/Qwen DecoderLm
// split as vLLM splits it, and generating batches of prompts with token ids and log-probabilities.
//
//   auto rollout = tessera::RolloutEngine::create({.model_dir = "ckpt/qwen3-0.6b"});
//   auto out = rollout->generate(prompts, params);   // out.tokens[i], out.logprobs[i]
//
// Prompts and sampling parameters are TP rank 0's (like vLLM's driver worker): the other ranks
// may pass anything (empty); rank 0 broadcasts them, so every rank runs the same batch, and rank
// 0's sampled tokens are broadcast each step. Every rank returns the same result.
// Weights come from a Hugging Face directory at create() or later through load_weights(), or from
// a RolloutSink (weight_sync.h): in place through model(), or double-buffered through the standby
// slot below, which generate() swaps in on every TP rank at the same call.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/decoder.h"
#include "core/nn/generation.h"

namespace tessera::transport {
class Communicator;
}

namespace tessera {

struct RolloutOptions {
  // config.json + safetensors weights; or only config_path and the weights come later.
  std::string model_dir;
  std::string config_path;  // default: model_dir/config.json
  at::ScalarType dtype = at::kFloat;
  // The TP group; default: the whole job (from tessera-launch's environment).
  std::shared_ptr<transport::Communicator> group;
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
};

class RolloutEngine {
 public:
  // Collective over the group: every rank calls it with the same options.
  static std::unique_ptr<RolloutEngine> create(const RolloutOptions& options);
  ~RolloutEngine();

  nn::GenerationResult generate(const std::vector<std::vector<int64_t>>& prompts, const nn::SamplingParams& params,
                                bool use_kv_cache = true);
  // Replaces the weights from a Hugging Face directory (checked whole before any is written)
  // and advances the weight version once every TP rank has loaded its shards. When a rank fails
  // every rank throws; if a failure came after writing began (the files changed meanwhile),
  // weight_version() drops to 0 and generate() refuses until a good load.
  void load_weights(const std::string& dir);
  // 0 until weights arrived (created from a config alone): generate() refuses to run on the
  // random initialisation. Each complete load (or, later, sync) adds 1.
  uint64_t weight_version() const;
  // For the rollout sink: a complete, verified sync has written every parameter of model():
  // version + 1, generation may go on.
  uint64_t publish_synced_weights();
  // For the rollout sink: a sync into model() in place may write from now on; generate() refuses
  // until the next good one (a failed sync may leave a mix of two versions).
  void mark_weights_torn();
  // A sync that was withdrawn before any byte moved: the weights it had marked serve again.
  void unmark_weights_torn();
  bool weights_torn() const;

  // Double-buffered updates, for the rollout sink: a second set of tensors shaped as model()'s
  // parameters (in named_parameters order; a clone of them at first use), written while generate()
  // reads the live ones. standby_for_writing() waits while a staged set still awaits its swap
  // (until `timeout`; throws TimeoutError) and lends the set; standby_written(true) stages it,
  // false drops it (the live weights keep serving). The next generate() after staging swaps it in on
  // every TP rank (TP rank 0 decides and says so in its broadcast request; the others wait for
  // their own staged set) and adds 1 to the version. The swap exchanges storages (no copy).
  std::vector<at::Tensor> standby_for_writing(std::chrono::milliseconds timeout);
  uint64_t standby_written(bool verified);  // the version the staged set will be; 0 if dropped
  uint64_t staged_version() const;  // the version the staged set becomes live as; 0: none staged
  // For the sink: use `tensors` (shaped as the parameters, in their order) as the standby set from
  // now on (memory it registered); they get the live values. Only while nothing is lent or staged.
  void adopt_standby(std::vector<at::Tensor> tensors);
  // Time generate() spent in its last swap (the pause a double-buffered sync costs generation).
  double last_swap_ms() const { return last_swap_ms_; }

  int tp_rank() const;
  int tp_size() const;
  const nn::DecoderConfig& config() const { return model_->config(); }
  at::ScalarType dtype() const { return model_->dtype(); }
  nn::DecoderLm& model() { return *model_; }

 private:
  RolloutEngine() = default;
  std::shared_ptr<transport::Communicator> group_;
  std::chrono::milliseconds timeout_{0};
  std::unique_ptr<nn::DecoderLm> model_;
  // The published weights: version, torn flag and the standby slot (whose staged set is version
  // + 1), one object under one mutex (rollout_engine.cpp); every read and write goes through it.
  // Writers: the user's thread (load_weights; generate() swapping a staged set in) and the sink's
  // thread (mark_weights_torn, publish_synced_weights, standby_for_writing, standby_written).
  // Readers: both (weight_version, weights_torn, staged_version, generate()'s checks, the sink's
  // error messages). A listening sink writes while the user's thread generates.
  struct Weights;
  std::unique_ptr<Weights> weights_;
  double last_swap_ms_ = 0;  // written and read by the generating (user's) thread only
  bool take_staged(bool wait, std::chrono::milliseconds timeout);  // swaps; false when none staged
  void drop_weights();  // version 0: a load failed after writing began
};

}  // namespace tessera
