// Sampling the next token of a batch from its logits: greedy, or temperature, top-k and top-p
// (nucleus) from a seeded generator, so a run is reproducible. The parameters follow vLLM's
// SamplingParams; the log-probabilities returned are of the chosen token under the model's own
// distribution (log_softmax of the raw logits), as vLLM returns by default.
//
// Order of the filters: logits / temperature, keep the top_k largest (and every token tied with
// the k-th, as vLLM), keep the smallest set of most likely tokens whose probability reaches top_p
// (the most likely token always stays), then draw from the renormalised rest.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace tessera::nn {

struct SamplingParams {
  double temperature = 1.0;    // below 1e-5: greedy (argmax; the first of equal maxima), as vLLM
  int64_t top_k = 0;           // 0: off
  double top_p = 1.0;          // 1: off; in (0, 1]
  int64_t max_new_tokens = 16;
  std::vector<int64_t> stop_token_ids;  // besides the model's eos_token_id
  bool ignore_eos = false;              // do not stop at the model's eos_token_id
  uint64_t seed = 0;                    // of the generator of one generate() call
};

// Temperatures below this sample greedily (dividing by them would overflow to inf).
constexpr double kGreedyBelow = 1e-5;

// Refuses (tessera::ConfigError naming the field) parameters out of range.
void check_sampling_params(const SamplingParams& params);

struct SampledTokens {
  at::Tensor tokens;    // [B] int64
  at::Tensor logprobs;  // [B] fp32: log_softmax(logits)[token]
};

// logits [B, V] fp32.
SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& params, at::Generator& generator);

}  // namespace tessera::nn
