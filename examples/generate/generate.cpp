// generate: the rollout side on its own. A job of N ranks under tessera-launch is one
// tensor-parallel group of size N running a Llama/Qwen model from a Hugging Face directory; it
// generates continuations of byte-level prompts (the bundled tiny model's vocabulary is bytes)
// and prints them with their mean log-probability.
//
//   tools/tessera-launch --nproc-per-node 2 build/examples/generate/generate --model-dir out/tiny-qwen3 \
//       --prompt "The license" --prompt "Permission is" --temperature 0.8 --seed 1
//
// --token-ids "1 2 3" gives a prompt as token ids instead (any vocabulary); output is ids then.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <cstdio>
#include <sstream>
#include <thread>

#include "actors/rollout/rollout_engine.h"
#include "core/error.h"
#include "examples/example_main.h"
#include "transport/launch_env.h"

int main(int argc, char** argv) {
  CLI::App app{"Generate with a Llama/Qwen model, tensor-parallel over the launched ranks"};
  std::string model_dir;
  std::vector<std::string> prompts_text, token_prompts;
  tessera::nn::SamplingParams params;
  params.max_new_tokens = 48;
  bool no_cache = false;
  std::string dtype = "fp32";
  app.add_option("--model-dir", model_dir, "config.json + safetensors")->required()->check(CLI::ExistingDirectory);
  app.add_option("--prompt", prompts_text, "a prompt, as bytes (repeatable)");
  app.add_option("--token-ids", token_prompts, "a prompt as space-separated token ids (repeatable)");
  app.add_option("--max-new-tokens", params.max_new_tokens, "tokens to generate at most")->check(CLI::PositiveNumber);
  app.add_option("--temperature", params.temperature, "0 = greedy");
  app.add_option("--top-k", params.top_k, "0 = off");
  app.add_option("--top-p", params.top_p, "1 = off");
  app.add_option("--seed", params.seed, "sampling seed");
  app.add_option("--stop", params.stop_token_ids, "extra stop token ids");
  app.add_flag("--ignore-eos", params.ignore_eos, "do not stop at the model's eos_token_id");
  app.add_flag("--no-kv-cache", no_cache, "recompute the whole sequence every step");
  app.add_option("--dtype", dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  CLI11_PARSE(app, argc, argv);

  std::string who = "generate";
  return tessera::examples::run_main(who, [&] {
    const auto env = tessera::transport::LaunchEnv::from_env();
    who = "generate (rank " + std::to_string(env.rank) + ")";
    at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.local_world_size)));
    std::vector<std::vector<int64_t>> prompts;
    for (const auto& text : prompts_text) {
      std::vector<int64_t> p;
      for (unsigned char byte : text) p.push_back(byte);
      prompts.push_back(p);
    }
    for (const auto& ids : token_prompts) {
      std::istringstream in(ids);
      std::vector<int64_t> p;
      for (int64_t t; in >> t;) p.push_back(t);
      if (!in.eof()) throw tessera::ConfigError("--token-ids '" + ids + "': expected space-separated integers");
      prompts.push_back(p);
    }
    if (prompts.empty()) prompts.push_back({'T', 'h', 'e', ' '});
    tessera::RolloutOptions options;
    options.model_dir = model_dir;
    options.dtype = dtype == "bf16" ? at::kBFloat16 : at::kFloat;
    auto rollout = tessera::RolloutEngine::create(options);
    const auto start = std::chrono::steady_clock::now();
    const auto out = rollout->generate(prompts, params, !no_cache);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (env.rank != 0) return 0;
    const bool bytes = token_prompts.empty() && rollout->config().vocab_size <= 256;
    int64_t total = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      double sum = 0;
      for (float lp : out.logprobs[i]) sum += lp;
      total += int64_t(out.tokens[i].size());
      std::printf("[%zu] (%zu tokens, %s, mean logprob %.3f) ", i, out.tokens[i].size(), out.finish_reasons[i].c_str(),
                  out.tokens[i].empty() ? 0.0 : sum / double(out.tokens[i].size()));
      if (bytes) {
        std::string text(prompts[i].begin(), prompts[i].end()), generated(out.tokens[i].begin(), out.tokens[i].end());
        std::printf("%s|%s\n", text.c_str(), generated.c_str());
      } else {
        for (auto t : out.tokens[i]) std::printf("%lld ", static_cast<long long>(t));
        std::printf("\n");
      }
    }
    std::printf("generate: TP %d, %lld tokens in %.2f s (%.0f tokens/s), KV cache %s\n", rollout->tp_size(),
                static_cast<long long>(total), seconds, double(total) / seconds, no_cache ? "off" : "on");
    return 0;
  });
}
