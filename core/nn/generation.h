// Batched generation with a DecoderLm (one rank of a TP group, or the whole model): prompts of
// different lengths are left-padded into one batch, prefilled together, then extended one token
// per step from the KV cache (or, without it, by re-running the whole sequence: the oracle).
//
// A sequence finishes at a stop token (the model's eos_token_id unless ignore_eos, and
// stop_token_ids; the stop token is kept, as vLLM does), after max_new_tokens, or when its next
// position would leave the context (max_position_embeddings): finish reason "stop" or "length".
// On a TP group every rank calls generate() with the same prompts and parameters; the tokens of
// TP rank 0 are broadcast each step, so all ranks follow one sequence whatever their rounding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/decoder.h"
#include "core/nn/sampling.h"

namespace tessera::nn {

struct GenerationResult {
  std::vector<std::vector<int64_t>> tokens;   // the new tokens of each prompt
  std::vector<std::vector<float>> logprobs;   // log-probability of each new token (sampling.h)
  std::vector<std::string> finish_reasons;    // "stop" | "length"
};

// Refuses (tessera::Error naming the prompt) an empty batch or prompt, token ids outside the
// vocabulary, and a prompt with no room for one new token in the context.
void check_prompts(const DecoderConfig& config, const std::vector<std::vector<int64_t>>& prompts);

GenerationResult generate(const DecoderLm& model, const std::vector<std::vector<int64_t>>& prompts,
                          const SamplingParams& params, bool use_kv_cache = true);

}  // namespace tessera::nn
