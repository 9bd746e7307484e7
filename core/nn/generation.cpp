#include "core/nn/generation.h"

#include <torch/torch.h>

#include <algorithm>
#include <set>

#include "core/error.h"

namespace tessera::nn {

void check_prompts(const DecoderConfig& c, const std::vector<std::vector<int64_t>>& prompts) {
  if (prompts.empty()) throw Error("generate: no prompts");
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& p = prompts[i];
    const auto where = "generate: prompt " + std::to_string(i);
    if (p.empty()) throw Error(where + " is empty");
    if (int64_t(p.size()) >= c.max_position_embeddings)
      throw Error(where + " has " + std::to_string(p.size()) + " tokens; the context is " +
                  std::to_string(c.max_position_embeddings) + " (max_position_embeddings), no room for a new token");
    for (size_t j = 0; j < p.size(); ++j)
      if (p[j] < 0 || p[j] >= c.vocab_size)
        throw Error(where + ": token " + std::to_string(j) + " is " + std::to_string(p[j]) +
                    ", outside the vocabulary [0, " + std::to_string(c.vocab_size) + ")");
  }
}

GenerationResult generate(const DecoderLm& model, const std::vector<std::vector<int64_t>>& prompts,
                          const SamplingParams& params, bool use_kv_cache) {
  const auto& c = model.config();
  check_sampling_params(params);
  check_prompts(c, prompts);
  torch::NoGradGuard no_grad;
  const int64_t B = int64_t(prompts.size());
  int64_t L = 0;
  std::vector<int64_t> limit(B);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t n = int64_t(prompts[i].size());
    L = std::max(L, n);
    limit[i] = std::min(params.max_new_tokens, c.max_position_embeddings - n);
  }
  const int64_t steps = *std::max_element(limit.begin(), limit.end());
  std::set<int64_t> stops(params.stop_token_ids.begin(), params.stop_token_ids.end());
  if (!params.ignore_eos) stops.insert(c.eos_token_ids.begin(), c.eos_token_ids.end());

  // Left padding: real tokens end at slot L - 1 in every row.
  auto ids = torch::zeros({B, L + steps}, torch::kLong);
  auto mask = torch::zeros({B, L + steps}, torch::kLong);
  for (int64_t i = 0; i < B; ++i) {
    const int64_t n = int64_t(prompts[i].size());
    ids[i].narrow(0, L - n, n).copy_(torch::tensor(prompts[i], torch::kLong));
    mask[i].narrow(0, L - n, n).fill_(1);
    mask[i].narrow(0, L, steps).fill_(1);
  }
  // Every slot's RoPE position, known up front (generated slots are all real).
  const auto positions = (mask.cumsum(1) - 1).clamp_min(0);

  GenerationResult result;
  result.tokens.resize(B), result.logprobs.resize(B), result.finish_reasons.assign(B, "");
  auto generator = at::detail::createCPUGenerator(params.seed);
  const auto& tp = model.tp();
  KvCache cache;
  if (use_kv_cache) cache = model.new_cache(B, L + steps);
  int64_t open = B;
  for (int64_t s = 0; s < steps && open > 0; ++s) {
    const int64_t slots = L + s;
    DecoderInputs in;
    in.last_only = true;
    in.attention_mask = mask.narrow(1, 0, slots);
    torch::Tensor input;
    if (!use_kv_cache) {
      input = ids.narrow(1, 0, slots);
      in.position_ids = positions.narrow(1, 0, slots);
    } else {
      in.cache = &cache;
      input = ids.narrow(1, cache.length, slots - cache.length);
      in.position_ids = positions.narrow(1, cache.length, slots - cache.length);
    }
    auto logits = model.forward(input, in).select(1, 0);
    auto next = sample_tokens(logits, params, generator);
    if (tp.sharded()) {
      // Rank 0's tokens; their log-probabilities from this rank's logits, which are the same
      // bytes on every rank (gathered), so one broadcast a step is enough.
      next.tokens = next.tokens.contiguous();
      tp.broadcast(next.tokens);
      next.logprobs = torch::log_softmax(logits, -1).gather(-1, next.tokens.unsqueeze(-1)).squeeze(-1);
    }
    ids.select(1, slots).copy_(next.tokens);
    auto tokens = next.tokens.accessor<int64_t, 1>();
    auto logprobs = next.logprobs.accessor<float, 1>();
    for (int64_t i = 0; i < B; ++i) {
      if (!result.finish_reasons[i].empty()) continue;
      result.tokens[i].push_back(tokens[i]);
      result.logprobs[i].push_back(logprobs[i]);
      if (stops.count(tokens[i])) result.finish_reasons[i] = "stop";
      else if (int64_t(result.tokens[i].size()) == limit[i]) result.finish_reasons[i] = "length";
      if (!result.finish_reasons[i].empty()) --open;
    }
  }
  return result;
}

}  // namespace tessera::nn
