// The generation engine at TP 1, 2 and 4 (run by tessera-launch with 1, 2, 4 processes over real
// Gloo) against the unsharded model run in this process, for each family. Row-parallel sums change
// the summation order, so the bar is: per-token log-probabilities within 1e-4, and greedy tokens
// equal wherever the oracle's top-2 logit margin exceeds 1e-3 (a sequence is compared up to its
// first near-tie). With and without the KV cache alike; seeded sampling reproducible.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <set>

#include "actors/rollout/rollout_engine.h"
#include "core/error.h"
#include "tests/nn/decoder_models.h"
#include "transport/launch_env.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

const auto kEnv = transport::LaunchEnv::from_env();

// Every rank writes the same deterministic model to its own directory.
std::string model_dir(const std::string& family) {
  const auto dir = fs::temp_directory_path() /
                   ("tessera_rollout_" + family + "_" + std::to_string(::getppid()) + "_" + std::to_string(kEnv.rank));
  static std::set<std::string> written;  // by this process (a stale directory of an old run is replaced)
  if (written.insert(family).second) {
    fs::remove_all(dir);
    nn::DecoderOptions o;
    o.init_std = 0.2;  // margins well above 1e-3 for most tokens
    o.seed = 21;
    nn::DecoderLm model(nn::testing::family_config(family), o);
    nn::testing::randomize_norms_and_biases(model.module(), 22);
    model.save_pretrained(dir.string());
  }
  return dir.string();
}

const std::vector<std::vector<int64_t>> kPrompts = {{5, 9, 11, 3, 40}, {7}, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {60, 61, 62}};

struct Compared {
  int64_t tokens = 0, near_ties = 0;
  double max_logprob_diff = 0;
};

// `got` against the oracle `ref` (both for kPrompts), the oracle's margins from a teacher-forced
// forward of each of its sequences alone.
Compared compare(const nn::GenerationResult& got, const nn::GenerationResult& ref, const nn::DecoderLm& oracle) {
  Compared c;
  torch::NoGradGuard no_grad;
  REQUIRE(got.tokens.size() == ref.tokens.size());
  for (size_t i = 0; i < ref.tokens.size(); ++i) {
    auto sequence = kPrompts[i];
    sequence.insert(sequence.end(), ref.tokens[i].begin(), ref.tokens[i].end());
    auto logits = oracle.forward(torch::tensor(sequence, torch::kLong).unsqueeze(0))[0];
    const size_t n = std::min(got.tokens[i].size(), ref.tokens[i].size());
    for (size_t j = 0; j < n; ++j) {
      auto top2 = std::get<0>(logits[int64_t(kPrompts[i].size() + j - 1)].topk(2));
      const double margin = (top2[0] - top2[1]).item<double>();
      INFO("prompt " << i << " token " << j << " margin " << margin);
      if (got.tokens[i][j] != ref.tokens[i][j]) {
        CHECK(margin <= 1e-3);
        ++c.near_ties;
        break;
      }
      const double diff = std::abs(got.logprobs[i][j] - ref.logprobs[i][j]);
      c.max_logprob_diff = std::max(c.max_logprob_diff, diff);
      CHECK(diff <= 1e-4);
      ++c.tokens;
      if (j + 1 == n) CHECK(got.tokens[i].size() == ref.tokens[i].size());
    }
  }
  return c;
}

}  // namespace

TEST_CASE("Greedy generation at this TP size equals the unsharded model, with and without the KV cache",
          "[rollout][tp]") {
  for (const auto& [family, text] : nn::testing::family_configs()) {
    INFO(family << " at TP " << kEnv.world_size);
    const auto dir = model_dir(family);
    auto oracle = nn::load_pretrained(dir);
    nn::SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 12;
    greedy.ignore_eos = true;
    const auto ref = nn::generate(oracle, kPrompts, greedy, /*use_kv_cache=*/false);
    auto rollout = RolloutEngine::create({dir});
    REQUIRE(rollout->tp_size() == kEnv.world_size);
    for (bool cache : {true, false}) {
      INFO("kv cache " << cache);
      const auto got = rollout->generate(kPrompts, greedy, cache);
      const auto c = compare(got, ref, oracle);
      if (kEnv.rank == 0)
        std::printf("%s TP %d cache %d: %ld tokens compared, %ld near-ties, max |logprob diff| %.3g\n", family.c_str(),
                    kEnv.world_size, int(cache), long(c.tokens), long(c.near_ties), c.max_logprob_diff);
      CHECK(c.tokens >= 40);  // of 48: the comparison is not hollow
      for (const auto& reason : got.finish_reasons) CHECK(reason == "length");
    }
    // Negative control: one changed element of every rank's q_proj shard must be seen.
    {
      torch::NoGradGuard no_grad;
      rollout->model().module()->named_parameters()["model.layers.1.self_attn.q_proj.weight"][0][0].add_(0.5);
      const auto changed = rollout->generate(kPrompts, greedy, true);
      double worst = 0;
      bool tokens_differ = changed.tokens != ref.tokens;
      for (size_t i = 0; i < ref.tokens.size(); ++i)
        for (size_t j = 0; j < std::min(ref.tokens[i].size(), changed.tokens[i].size()); ++j)
          worst = std::max(worst, double(std::abs(changed.logprobs[i][j] - ref.logprobs[i][j])));
      CHECK((tokens_differ || worst > 1e-3));
      rollout->load_weights(dir);  // back to the saved weights
    }
    // Without the cache at TP 1 the engine and the oracle run the same operations: bitwise.
    if (kEnv.world_size == 1) {
      const auto same = rollout->generate(kPrompts, greedy, false);
      CHECK(same.tokens == ref.tokens);
      CHECK(same.logprobs == ref.logprobs);
    }
  }
}

TEST_CASE("Seeded sampling is reproducible; stop tokens end a sequence and are kept", "[rollout][sampling]") {
  const auto dir = model_dir("qwen3");
  auto rollout = RolloutEngine::create({dir});
  nn::SamplingParams p;
  p.temperature = 0.9, p.top_k = 30, p.top_p = 0.9, p.max_new_tokens = 10, p.seed = 7, p.ignore_eos = true;
  const auto a = rollout->generate(kPrompts, p), b = rollout->generate(kPrompts, p);
  CHECK(a.tokens == b.tokens);
  CHECK(a.logprobs == b.logprobs);
  p.seed = 8;
  CHECK(rollout->generate(kPrompts, p).tokens != a.tokens);
  // Only rank 0's prompts, parameters and cache choice count: the others pass anything.
  p.seed = 7;
  const auto c = rollout->generate(kEnv.rank == 0 ? kPrompts : std::vector<std::vector<int64_t>>{},
                                   kEnv.rank == 0 ? p : nn::SamplingParams{}, /*use_kv_cache=*/kEnv.rank != 0);
  CHECK(c.tokens == rollout->generate(kPrompts, p, false).tokens);

  // Stop at the token the first sequence samples third.
  p.stop_token_ids = {a.tokens[0][2]};
  const auto stopped = rollout->generate(kPrompts, p);
  CHECK(stopped.finish_reasons[0] == "stop");
  CHECK(stopped.tokens[0] == std::vector<int64_t>(a.tokens[0].begin(), a.tokens[0].begin() + 3));
  // max_new_tokens and the context bound.
  p.stop_token_ids.clear();
  p.max_new_tokens = 100;  // context 64
  const auto bounded = rollout->generate(kPrompts, p);
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    CHECK(bounded.finish_reasons[i] == "length");
    CHECK(kPrompts[i].size() + bounded.tokens[i].size() == 64);
  }
}

TEST_CASE("bf16 generation at this TP size follows the fp32 model within bf16 rounding", "[rollout][bf16]") {
  const auto dir = model_dir("qwen3");
  auto oracle = nn::load_pretrained(dir);
  nn::SamplingParams greedy;
  greedy.temperature = 0, greedy.max_new_tokens = 12, greedy.ignore_eos = true;
  const auto ref = nn::generate(oracle, kPrompts, greedy);
  RolloutOptions options;
  options.model_dir = dir;
  options.dtype = at::kBFloat16;
  auto rollout = RolloutEngine::create(options);
  const auto got = rollout->generate(kPrompts, greedy);
  double sum = 0;
  int64_t n = 0;
  for (size_t i = 0; i < ref.tokens.size(); ++i)
    for (size_t j = 0; j < ref.tokens[i].size() && got.tokens[i][j] == ref.tokens[i][j]; ++j, ++n)
      sum += std::abs(got.logprobs[i][j] - ref.logprobs[i][j]);
  if (kEnv.rank == 0) std::printf("bf16 TP %d: %ld tokens as fp32's, mean |logprob diff| %.3g\n", kEnv.world_size, long(n), sum / double(n));
  CHECK(n >= 24);
  CHECK(sum / double(n) < 0.05);
}

TEST_CASE("Bad requests are refused on every rank alike, and the engine stays usable", "[rollout][errors]") {
  {
    RolloutOptions config_only;
    config_only.config_path = model_dir("llama");
    auto waiting = RolloutEngine::create(config_only);
    CHECK(waiting->weight_version() == 0);
    CHECK_THROWS_WITH(waiting->generate(kPrompts, {}), Catch::Contains("no weights yet"));
    waiting->load_weights(model_dir("llama"));
    CHECK(waiting->weight_version() == 1);
    CHECK(waiting->generate({{1}}, {}).tokens.size() == 1);
  }
  auto rollout = RolloutEngine::create({model_dir("llama")});
  nn::SamplingParams p;
  p.temperature = 0;
  CHECK_THROWS_WITH(rollout->generate({std::vector<int64_t>(64, 1)}, p), Catch::Contains("prompt 0 has 64 tokens"));
  CHECK_THROWS_WITH(rollout->generate({{1, 2}, {3, 97}}, p), Catch::Contains("prompt 1: token 1 is 97"));
  CHECK_THROWS_WITH(rollout->generate({{1}, {}}, p), Catch::Contains("prompt 1 is empty"));
  p.top_p = 0;
  CHECK_THROWS_WITH(rollout->generate({{1}}, p), Catch::Contains("top_p"));
  p.top_p = 1;
  CHECK(rollout->generate({{1, 2, 3}}, p).tokens[0].size() == 16);
  // Weights of another model are refused before any is written.
  CHECK_THROWS_AS(rollout->load_weights(model_dir("qwen3")), tessera::CheckpointError);
  CHECK(rollout->generate({{1, 2, 3}}, p).tokens[0].size() == 16);
}
