// gen_bench: generation throughput of RolloutEngine (one TP group = the launched ranks) on a
// randomly initialised Qwen3-shaped DecoderLm, with the KV cache and without it (every step
// re-runs the whole sequence), greedy, ignore_eos, so every sequence makes --new-tokens tokens.
//
//   tools/tessera-launch --nproc-per-node 2 --master-port 29841 build/bench/generate/gen_bench
//   build/bench/generate/gen_bench --new-tokens 16          # TP 1, without the launcher
//   python3 bench/generate/run_generate_bench.py            # TP 1 and TP 2, and their ratios
//
// Each rank writes the same model (same seed) as a Hugging Face directory into its own
// /tmp/tessera_gen_bench_<ppid>_<rank> (removed at the end) and creates the engine from it. The
// batch: --batch random prompts (fixed seed) of lengths prompt_len - (3 i mod 16). Each mode gets
// one warm-up generate(), then the best wall time (steady_clock, on rank 0) of --repeats.
// tokens/s = batch * new_tokens / seconds. Rank 0 prints one JSON line per mode:
//   {"bench":"generate","tp":2,"kv_cache":true,"batch":8,"prompt_len":64,"new_tokens":64,"seconds":S,"tokens_per_s":T}
// then {"bench":"generate","tp":2,"ratio_kv_cache_to_recompute":R,"kv_cache_matches_recompute":B}
// (R: tokens/s with the cache over tokens/s without; B: both modes chose the same greedy tokens).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "actors/rollout/rollout_engine.h"
#include "core/nn/decoder.h"
#include "core/nn/decoder_config.h"
#include "transport/launch_env.h"

namespace {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(std::filesystem::path p) : path(std::move(p)) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

std::string qwen3_config_json(int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                              int64_t intermediate, int64_t vocab, int64_t context) {
  auto s = [](int64_t v) { return std::to_string(v); };
  return R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": )" + s(vocab) +
         R"(, "hidden_size": )" + s(hidden) + R"(, "intermediate_size": )" + s(intermediate) +
         R"(, "num_hidden_layers": )" + s(layers) + R"(, "num_attention_heads": )" + s(heads) +
         R"(, "num_key_value_heads": )" + s(kv_heads) + R"(, "head_dim": )" + s(head_dim) +
         R"(, "max_position_embeddings": )" + s(context) +
         R"(, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false,
           "attention_bias": false, "hidden_act": "silu", "rope_scaling": null, "use_sliding_window": false,
           "sliding_window": null, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"})";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Generation throughput of RolloutEngine with and without the KV cache (launch with tessera-launch)"};
  int64_t hidden = 512, layers = 4, heads = 8, kv_heads = 2, head_dim = 64, intermediate = 1536, vocab = 4096,
          context = 1024;
  int batch = 8, prompt_len = 64, new_tokens = 64, repeats = 3;
  uint64_t seed = 1234;
  int threads = 0;
  app.add_option("--hidden", hidden, "hidden_size")->check(CLI::PositiveNumber);
  app.add_option("--layers", layers, "num_hidden_layers")->check(CLI::PositiveNumber);
  app.add_option("--heads", heads, "num_attention_heads")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", kv_heads, "num_key_value_heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", head_dim, "head_dim")->check(CLI::PositiveNumber);
  app.add_option("--intermediate", intermediate, "intermediate_size")->check(CLI::PositiveNumber);
  app.add_option("--vocab", vocab, "vocab_size")->check(CLI::Range(int64_t(3), int64_t(1) << 40));
  app.add_option("--context", context, "max_position_embeddings")->check(CLI::PositiveNumber);
  app.add_option("--batch", batch, "prompts per generate()")->check(CLI::PositiveNumber);
  app.add_option("--prompt-len", prompt_len, "longest prompt (prompt i has prompt_len - (3 i mod 16) tokens)")
      ->check(CLI::PositiveNumber);
  app.add_option("--new-tokens", new_tokens, "max_new_tokens (every sequence reaches it: ignore_eos)")
      ->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed generate() calls per mode after one warm-up (best is kept)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", seed, "model and prompt seed");
  app.add_option("--threads", threads, "intra-op threads per rank (0: hardware_concurrency / ranks on this node)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);

  const auto env = tessera::transport::LaunchEnv::from_env();
  // Ranks on one machine share its cores: no oversubscription.
  at::set_num_threads(threads > 0 ? threads
                                  : std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.local_world_size)));
  try {
    if (prompt_len + new_tokens > context)
      throw std::runtime_error("--prompt-len + --new-tokens (" + std::to_string(prompt_len + new_tokens) +
                               ") exceeds --context " + std::to_string(context));
    const auto config = tessera::nn::parse_decoder_config(
        qwen3_config_json(hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, context), "gen_bench");
    TempDir dir(std::filesystem::temp_directory_path() /
                ("tessera_gen_bench_" + std::to_string(::getppid()) + "_" + std::to_string(env.rank)));
    {
      tessera::nn::DecoderOptions options;
      options.seed = seed;
      tessera::nn::DecoderLm(config, options).save_pretrained(dir.path.string());
    }
    tessera::RolloutOptions rollout_options;
    rollout_options.model_dir = dir.path.string();
    auto rollout = tessera::RolloutEngine::create(rollout_options);
    const int tp = rollout->tp_size();

    std::vector<std::vector<int64_t>> prompts(batch);
    auto generator = at::detail::createCPUGenerator(seed);
    for (int i = 0; i < batch; ++i) {
      const int64_t n = std::max(1, prompt_len - (3 * i) % 16);
      auto ids = torch::randint(vocab, {n}, generator, torch::kLong);
      prompts[i].assign(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + n);
    }
    tessera::nn::SamplingParams params;
    params.temperature = 0;
    params.ignore_eos = true;
    params.max_new_tokens = new_tokens;
    params.seed = seed;

    double tokens_per_s[2] = {0, 0};
    std::vector<std::vector<int64_t>> outputs[2];
    for (const bool use_kv_cache : {true, false}) {
      auto result = rollout->generate(prompts, params, use_kv_cache);  // warm-up
      int64_t tokens = 0;
      for (const auto& t : result.tokens) tokens += int64_t(t.size());
      if (tokens != int64_t(batch) * new_tokens)
        throw std::runtime_error("generate made " + std::to_string(tokens) + " tokens, not batch * new_tokens = " +
                                 std::to_string(int64_t(batch) * new_tokens));
      outputs[use_kv_cache ? 0 : 1] = result.tokens;
      double best = 1e300;
      for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        rollout->generate(prompts, params, use_kv_cache);
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      }
      tokens_per_s[use_kv_cache ? 0 : 1] = double(tokens) / best;
      if (env.rank == 0)
        std::printf(
            "{\"bench\":\"generate\",\"tp\":%d,\"kv_cache\":%s,\"batch\":%d,\"prompt_len\":%d,\"new_tokens\":%d,"
            "\"seconds\":%.6f,\"tokens_per_s\":%.3f}\n",
            tp, use_kv_cache ? "true" : "false", batch, prompt_len, new_tokens, best, double(tokens) / best);
      std::fflush(stdout);
    }
    if (env.rank == 0)
      std::printf("{\"bench\":\"generate\",\"tp\":%d,\"ratio_kv_cache_to_recompute\":%.4f,"
                  "\"kv_cache_matches_recompute\":%s}\n",
                  tp, tokens_per_s[0] / tokens_per_s[1], outputs[0] == outputs[1] ? "true" : "false");
    std::fflush(stdout);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gen_bench (rank %d): %s\n", env.rank, e.what());
    return 1;
  }
  return 0;
}
