#include "core/nn/sampling.h"

#include <torch/torch.h>

#include <limits>

#include "core/error.h"

namespace tessera::nn {

void check_sampling_params(const SamplingParams& p) {
  auto fail = [](const std::string& field, const std::string& why) {
    throw ConfigError("sampling: " + field + ": " + why);
  };
  if (!(p.temperature >= 0) || !std::isfinite(p.temperature))
    fail("temperature", "must be >= 0 (0 = greedy), got " + std::to_string(p.temperature));
  if (p.top_k < 0) fail("top_k", "must be >= 0 (0 = off), got " + std::to_string(p.top_k));
  if (!(p.top_p > 0 && p.top_p <= 1)) fail("top_p", "must be in (0, 1], got " + std::to_string(p.top_p));
  if (p.max_new_tokens < 1) fail("max_new_tokens", "must be at least 1, got " + std::to_string(p.max_new_tokens));
  for (auto id : p.stop_token_ids)
    if (id < 0) fail("stop_token_ids", "token ids are not negative, got " + std::to_string(id));
}

SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& p, at::Generator& generator) {
  if (logits.dim() != 2 || logits.scalar_type() != torch::kFloat)
    throw Error("sample_tokens: logits must be [B, V] fp32");
  SampledTokens out;
  if (p.temperature < kGreedyBelow) {
    out.tokens = logits.argmax(-1);
  } else {
    auto scaled = logits / p.temperature;
    const float minus_inf = -std::numeric_limits<float>::infinity();
    if (p.top_k > 0 && p.top_k < scaled.size(-1)) {
      auto kth = std::get<0>(scaled.topk(p.top_k, -1)).narrow(-1, p.top_k - 1, 1);
      scaled = scaled.masked_fill(scaled < kth, minus_inf);
    }
    if (p.top_p < 1) {
      auto [sorted, order] = scaled.sort(-1, /*descending=*/true);
      auto probs = torch::softmax(sorted, -1);
      // Drop a token when the tokens before it already reach top_p (the first never goes).
      auto drop = (probs.cumsum(-1) - probs) >= p.top_p;
      scaled = scaled.scatter(-1, order, sorted.masked_fill(drop, minus_inf));
    }
    out.tokens = torch::multinomial(torch::softmax(scaled, -1), 1, false, generator).squeeze(-1);
  }
  out.logprobs = torch::log_softmax(logits, -1).gather(-1, out.tokens.unsqueeze(-1)).squeeze(-1);
  return out;
}

}  // namespace tessera::nn
