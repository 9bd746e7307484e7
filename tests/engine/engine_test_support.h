// What every engine test process shares: its rank and world size from tessera-launch's
// environment (RANK, WORLD_SIZE; 0 and 1 when run alone), the training corpus, and the
// single-process oracle's gradient averaging and comparison.
#pragma once

#include <catch2/catch.hpp>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/data/byte_corpus.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace tessera::engine_testing {

inline const int kRank = transport::LaunchEnv::from_env().rank;
inline const int kWorld = transport::LaunchEnv::from_env().world_size;

// Debian's license texts (base-files), loaded once per process.
inline const data::ByteCorpus& corpus() {
  static data::ByteCorpus c(data::ByteCorpus::default_paths());
  return c;
}

// The tests' small GPT: 2 blocks of width 32, 16-token context (tens of thousands of parameters:
// several reduce buckets, parameters straddling partitions).
inline nn::GptConfig small_gpt_config(uint64_t seed) {
  nn::GptConfig c;
  c.d_model = 32, c.n_layer = 2, c.n_head = 2, c.context = 16, c.seed = seed;
  return c;
}

// The oracle's gradients for one update: every rank's loss is differentiated in this process and
// the ranks' gradients are averaged the way the engine's reduction does ((g_0 + ... + g_W-1) / W).
inline void average_rank_gradients(const std::vector<torch::Tensor>& params,
                                   const std::function<torch::Tensor(int rank)>& loss_of_rank) {
  std::vector<torch::Tensor> sums(params.size());
  for (int rank = 0; rank < kWorld; ++rank) {
    for (auto& p : params) p.mutable_grad() = torch::Tensor();
    loss_of_rank(rank).backward();
    for (size_t i = 0; i < params.size(); ++i)
      sums[i] = rank == 0 ? params[i].grad().clone() : sums[i].add_(params[i].grad());
  }
  for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = sums[i].div_(kWorld);
}

inline std::map<std::string, torch::Tensor> snapshot_parameters(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& item : m.named_parameters()) out[item.key()] = item.value().detach().clone();
  return out;
}

// Bitwise at up to 2 ranks; at any size each tensor's relative L2 difference must be <= 1e-5 (at
// more ranks the ranks' gradients are summed in another order than the oracle's).
inline void expect_same_parameters(const std::map<std::string, torch::Tensor>& engine,
                                   const std::map<std::string, torch::Tensor>& oracle) {
  for (const auto& [name, p] : oracle) {
    const auto& q = engine.at(name);
    INFO(name << " max |diff| " << (p - q).abs().max().item<double>());
    if (kWorld <= 2) CHECK(torch::equal(p, q));
    CHECK((p - q).norm().item<double>() <= 1e-5 * p.norm().item<double>());
  }
}

}  // namespace tessera::engine_testing
