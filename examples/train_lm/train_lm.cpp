// train_lm: trains a small byte-level language model on Debian's license texts with tessera's ZeRO
// engine: TinyGpt by default, or a Llama/Qwen2/Qwen3 model from a Hugging Face config.json.
//
//   tools/tessera-launch --nproc-per-node 2 build/examples/train_lm/train_lm --config configs/zero2.toml
//   tools/tessera-launch --config_file configs/accelerate/zero3_plugin.yaml build/examples/train_lm/train_lm
//   tools/tessera-launch --nproc-per-node 2 build/examples/train_lm/train_lm --config examples/train_lm/train_lm.toml \
//       --model-config configs/models/tiny-qwen3 --save-dir out/tiny-qwen3
//   tools/tessera-launch --nproc-per-node 2 build/examples/train_lm/train_lm --config examples/train_lm/train_lm.toml \
//       --zero-stage 3          # train_lm.toml's stage is "auto": --zero-stage picks it (default 2)
//   ... --checkpoint-dir out/ckpt --save-every 10        # then, at another world size and stage:
//   tools/tessera-launch --nproc-per-node 1 build/examples/train_lm/train_lm ... --zero-stage 3 --micro-batch 16 \
//       --checkpoint-dir out/ckpt --resume --steps 40    # --steps is the total; same global batch, same data
//
// One training step, top to bottom (B = micro batch per rank, T = context, V = 256 bytes):
//   tokens, targets [B, T] int64   <- ByteCorpus::batch(seed, step, micro, B * world, T, rank, world)
//   logits [B, T, V]               <- the model's forward (the user's own; the engine does not wrap it)
//   loss []                        <- cross-entropy(logits, targets)
//   engine->backward(loss)         <- (loss / accumulation).backward(); at the boundary micro-step the
//                                     gradient-reducer reduces buckets of the flat gradients meanwhile
//   engine->step()                 <- at the boundary: wait reductions, clip, update this rank's
//                                     partition (fp32 master), all-gather the new weights
// At ZeRO stage 3 the weights stay partitioned: each module's are gathered just before its forward
// (and again before its backward) and released after, and gradients are reduce-scattered per
// module. A released weight has no memory, so saving reads the model inside
// engine->gathered_parameters() (every rank enters it: it is a collective).
// Rank 0 prints a progress line (step, loss, tokens/s, lr, loss scale) and writes a CSV of the curve.
#include <CLI/CLI.hpp>

#include <array>
#include <torch/torch.h>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include "actors/engine/engine.h"
#include "core/config/launch_config.h"
#include "core/data/byte_corpus.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "core/nn/tiny_gpt.h"
#include "core/zero/partitioned_construction.h"
#include "examples/example_main.h"
#include "transport/launch_env.h"

namespace {

// The model trained: TinyGpt or a Hugging Face-configured decoder, behind one loss and module.
struct LanguageModel {
  std::shared_ptr<tessera::nn::TinyGpt> gpt;
  std::shared_ptr<tessera::nn::DecoderLm> decoder;
  int64_t hidden_size = 0;

  explicit LanguageModel(const tessera::nn::GptConfig& c)
      : gpt(std::make_shared<tessera::nn::TinyGpt>(c)), hidden_size(c.d_model) {}
  LanguageModel(const std::string& config_path, const std::string& weights, int64_t context) {
    const auto config = tessera::nn::load_decoder_config(config_path);
    if (config.vocab_size < 256)
      throw tessera::ConfigError(config_path + ": vocab_size " + std::to_string(config.vocab_size) +
                                 ": the corpus is bytes, so at least 256 tokens are needed");
    if (context > config.max_position_embeddings)
      throw tessera::ConfigError("--context " + std::to_string(context) + " exceeds max_position_embeddings " +
                                 std::to_string(config.max_position_embeddings) + " of " + config_path);
    decoder = std::make_shared<tessera::nn::DecoderLm>(
        weights.empty() ? tessera::nn::DecoderLm(config) : tessera::nn::load_pretrained(weights));
    hidden_size = config.hidden_size;
  }
  std::shared_ptr<torch::nn::Module> module() const { return gpt ? gpt->module() : decoder->module(); }
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets) const {
    return gpt ? gpt->loss(tokens, targets) : decoder->loss(tokens, targets);
  }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Train a small byte-level GPT with tessera's ZeRO engine (launch with tessera-launch)"};
  std::string config_path;
  int steps = 30, micro_batch = 8, log_every = 0;
  double lr = 3e-3;
  uint64_t seed = 1;
  std::string csv_path = "train_lm_loss.csv";
  std::vector<std::string> corpus_paths = tessera::data::ByteCorpus::default_paths();
  tessera::nn::GptConfig model_config;
  model_config.d_model = 192, model_config.n_layer = 6, model_config.n_head = 6, model_config.context = 64;
  app.add_option("--config", config_path, "tessera TOML or DeepSpeed JSON configuration (default: the launcher's, "
                 "from tessera-launch --config_file accelerate.yaml)")->check(CLI::ExistingFile);
  app.add_option("--steps", steps, "optimizer steps")->check(CLI::PositiveNumber);
  app.add_option("--micro-batch", micro_batch, "sequences per rank per micro-step (fills \"auto\")")->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "learning rate (fills \"auto\")");
  app.add_option("--seed", seed, "data order seed");
  app.add_option("--csv", csv_path, "loss curve written by rank 0 (\"\" = none)");
  app.add_option("--corpus", corpus_paths, "text files or directories");
  app.add_option("--d-model", model_config.d_model, "model width");
  app.add_option("--layers", model_config.n_layer, "transformer blocks");
  app.add_option("--heads", model_config.n_head, "attention heads");
  app.add_option("--context", model_config.context, "tokens per sequence");
  std::string hf_config, init_weights, save_dir;
  app.add_option("--model-config", hf_config, "a Llama/Qwen2/Qwen3 config.json (or its directory) instead of TinyGpt");
  app.add_option("--init-weights", init_weights, "start from this Hugging Face weight directory (with --model-config)");
  app.add_option("--save-dir", save_dir, "the trained model as a Hugging Face directory (save_16bit_model: every rank writes its part; with --model-config)");
  std::string checkpoint_dir;
  int save_every = 0;
  bool resume = false;
  app.add_option("--checkpoint-dir", checkpoint_dir, "save checkpoints here (every --save-every steps and at the end)");
  app.add_option("--save-every", save_every, "save a checkpoint every N steps (with --checkpoint-dir)")->check(CLI::NonNegativeNumber);
  int stop_at = 0;
  app.add_option("--stop-at", stop_at, "stop after this step, as a preempted run would (the schedule stays --steps')")
      ->check(CLI::PositiveNumber);
  app.add_flag("--resume", resume, "continue from --checkpoint-dir's latest checkpoint (at any world size and stage); "
               "--steps is the total");
  app.add_option("--log-every", log_every, "print a line every N steps (default: the config's steps_per_print, 1 on a terminal)");
  // What fills the other "auto" values (a Hugging Face-style all-auto DeepSpeed JSON works as is);
  // an explicit value in the config wins, as with the Trainer.
  int grad_accum = 1, warmup_steps = 5;
  double weight_decay = 0.01, eps = 1e-8, grad_clip = 1.0;
  std::array<double, 2> betas{0.9, 0.95};
  std::string mixed_precision = "no";
  int zero_stage = 2;
  app.add_option("--grad-accum", grad_accum, "gradient accumulation steps (fills \"auto\")")->check(CLI::PositiveNumber);
  app.add_option("--weight-decay", weight_decay, "weight decay of matrices (fills \"auto\")");
  app.add_option("--betas", betas, "Adam betas (fills \"auto\")")->delimiter(',');
  app.add_option("--eps", eps, "Adam epsilon (fills \"auto\")");
  app.add_option("--grad-clip", grad_clip, "gradient clipping norm (fills \"auto\")");
  app.add_option("--warmup-steps", warmup_steps, "scheduler warmup steps (fills \"auto\")");
  app.add_option("--mixed-precision", mixed_precision, "no | fp16 | bf16 (fills \"auto\")")
      ->check(CLI::IsMember({"no", "fp16", "bf16"}));
  app.add_option("--zero-stage", zero_stage, "ZeRO stage (fills \"auto\")")->check(CLI::Range(0, 3));
  CLI11_PARSE(app, argc, argv);

  std::string who = "train_lm";
  return tessera::examples::run_main(who, [&] {
    const auto env = tessera::transport::LaunchEnv::from_env();
    const int rank = env.rank, world = env.world_size, local_world = env.local_world_size;
    who = "train_lm (rank " + std::to_string(rank) + ")";
    // Ranks on one machine share its cores: no oversubscription.
    at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, local_world)));
    tessera::data::ByteCorpus corpus(corpus_paths);
    if (hf_config.empty() && !(init_weights.empty() && save_dir.empty()))
      throw tessera::ConfigError("--init-weights and --save-dir need --model-config");
    const auto launched = tessera::config::launch_config_from_env();  // tessera-launch --config_file's
    auto config = tessera::config::program_config(config_path, launched);
    // zero3_init_flag: at stage 3 the model is built partitioned (not when --init-weights loads it:
    // the loader writes whole tensors).
    const int stage = config.zero_optimization.stage.is_auto ? zero_stage : int(config.zero_optimization.stage.value);
    std::optional<tessera::zero::PartitionedConstruction> partitioned;
    if (launched && launched->zero3_init && stage == 3 && init_weights.empty()) partitioned.emplace();
    const LanguageModel model = hf_config.empty() ? LanguageModel(model_config) : LanguageModel(hf_config, init_weights, model_config.context);
    const bool built_partitioned = partitioned.has_value();
    partitioned.reset();
    // --zero-stage fills "auto" only; a config that fixes another stage would silently win.
    const auto& stage_key = config.zero_optimization.stage;
    if (app.count("--zero-stage") && !stage_key.is_auto && stage_key.value != zero_stage)
      throw tessera::ConfigError(config.source + ": zero_optimization.stage = " + std::to_string(stage_key.value) +
                                 " but --zero-stage " + std::to_string(zero_stage) +
                                 ": --zero-stage only fills stage = \"auto\" (examples/train_lm/train_lm.toml has "
                                 "it); drop one of the two");
    tessera::InitializeOptions options;
    options.facts.micro_batch_size = micro_batch;
    options.facts.hidden_size = model.hidden_size;
    options.facts.lr = lr;
    options.facts.total_steps = steps;
    options.facts.gradient_accumulation_steps = grad_accum;
    options.facts.weight_decay = weight_decay;
    options.facts.betas = betas;
    options.facts.eps = eps;
    options.facts.gradient_clipping = grad_clip;
    options.facts.warmup_steps = warmup_steps;
    options.facts.mixed_precision = mixed_precision;
    options.facts.zero_stage = zero_stage;
    options.facts.save_16bit_model = false;  // --save-dir writes the model's own dtype
    options.facts.offload_optimizer_device = tessera::config::OffloadDevice::none;
    options.facts.offload_param_device = tessera::config::OffloadDevice::none;
    // GPT practice (nanoGPT, DeepSpeed-Chat): no weight decay on vectors (LayerNorm weights and
    // biases); a group's settings override the config's optimizer.params.
    if (config.optimizer) {
      options.param_groups.resize(2);
      for (const auto& item : model.module()->named_parameters())
        options.param_groups[item.value().dim() >= 2 ? 0 : 1].names.push_back(item.key());
      options.param_groups[1].weight_decay = 0.0;
    } else {
      // No optimizer section (Accelerate's and the Trainer's configs): bring our own, as they do.
      std::vector<torch::Tensor> matrices, vectors;
      for (const auto& p : model.module()->parameters()) (p.dim() >= 2 ? matrices : vectors).push_back(p);
      auto adamw = [&](double decay) {
        return std::make_unique<torch::optim::AdamWOptions>(
            torch::optim::AdamWOptions(lr).betas({betas[0], betas[1]}).eps(eps).weight_decay(decay));
      };
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(matrices, adamw(weight_decay));
      groups.emplace_back(vectors, adamw(0.0));
      options.optimizer = std::make_shared<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(lr));
    }
    if ((resume || save_every) && checkpoint_dir.empty()) throw tessera::ConfigError("--resume and --save-every need --checkpoint-dir");
    auto engine = tessera::initialize(model.module(), config, options).engine;
    // Resuming: the data order is a function of (seed, step), so the run continues as if never stopped.
    if (resume) {
      const auto loaded = engine->load_checkpoint(checkpoint_dir);
      if (rank == 0)
        std::printf("resumed from %s at step %lld\n", loaded.path.c_str(), static_cast<long long>(engine->global_steps()));
      if (engine->global_steps() >= steps) {
        if (rank == 0)
          std::printf("already at step %lld of %d: nothing to train\n", static_cast<long long>(engine->global_steps()), steps);
        return 0;
      }
    }
    const int first_step = int(engine->global_steps());
    auto save = [&](int done) {
      const auto path = engine->save_checkpoint(checkpoint_dir);
      if (rank == 0) std::printf("%ssaved checkpoint %s (step %d)\n", isatty(STDOUT_FILENO) ? "\n" : "", path.c_str(), done);
    };
    const auto& resolved = engine->config();
    if (resolved.fp16.enabled.value)
      throw tessera::Error(config.source +
                           ": fp16.enabled: this model runs on the CPU, where LibTorch has no fp16 kernels "
                           "(LayerNorm, matmul); use bf16 (--mixed-precision bf16 with \"auto\") or fp32");
    const int64_t micro = resolved.train_micro_batch_size_per_gpu.value;
    const int64_t accumulation = resolved.gradient_accumulation_steps.value;
    const bool tty = isatty(STDOUT_FILENO);
    if (log_every <= 0) log_every = tty ? 1 : int(std::max<int64_t>(1, resolved.steps_per_print));
    std::ofstream csv;
    if (rank == 0) {
      int64_t parameters = 0;
      for (const auto& p : model.module()->parameters()) parameters += p.numel();
      std::printf("train_lm: %lld parameters, %lld-byte corpus, world %d, ZeRO stage %lld, micro batch %lld x %lld "
                  "accumulation, %s\n",
                  static_cast<long long>(parameters), static_cast<long long>(corpus.size_bytes()), world,
                  static_cast<long long>(resolved.zero_optimization.stage.value), static_cast<long long>(micro),
                  static_cast<long long>(accumulation),
                  resolved.bf16.enabled.value ? "bf16" : resolved.fp16.enabled.value ? "fp16" : "fp32");
      if (launched && config_path.empty()) std::printf("train_lm: config from %s%s\n", launched->origin.c_str(),
                                built_partitioned ? "; model built partitioned (zero3_init_flag)" : "");
      if (!csv_path.empty()) {
        csv.open(csv_path, first_step > 0 ? std::ios::app : std::ios::trunc);  // a resumed run continues its curve
        if (first_step == 0) csv << "step,loss,lr,loss_scale,tokens_per_second,elapsed_s\n";
      }
    }
    const auto start = std::chrono::steady_clock::now();
    auto last = start;
    const int64_t tokens_per_step = micro * accumulation * world * model_config.context;
    const int last_step = stop_at > 0 ? std::min(stop_at, steps) : steps;
    for (int step = first_step; step < last_step; ++step) {
      const double lr_now = engine->get_lr();
      const double scale_now = engine->loss_scale();
      double loss_sum = 0;
      for (int64_t m = 0; m < accumulation; ++m) {
        auto batch = corpus.batch(seed, step, m, micro * world, model_config.context, rank, world);
        auto loss = model.loss(batch.tokens, batch.targets);
        engine->backward(loss);
        engine->step();
        loss_sum += loss.item<double>();
      }
      const auto now = std::chrono::steady_clock::now();
      const double step_s = std::chrono::duration<double>(now - last).count();
      const double elapsed = std::chrono::duration<double>(now - start).count();
      last = now;
      const double loss = loss_sum / double(accumulation);
      const double tokens_per_s = tokens_per_step / std::max(step_s, 1e-9);
      if (!checkpoint_dir.empty() && ((save_every > 0 && (step + 1) % save_every == 0) || step + 1 == last_step)) save(step + 1);
      if (rank != 0) continue;
      if (csv.is_open()) csv << step + 1 << "," << loss << "," << lr_now << "," << scale_now << "," << tokens_per_s << "," << elapsed << "\n";
      if ((step + 1) % log_every == 0 || step + 1 == steps) {
        const int width = 24, filled = int(width * double(step + 1) / steps);
        std::printf("%s[%s%s] step %d/%d | loss %.4f | %.0f tok/s | lr %.2e | scale %g%s", tty ? "\r" : "",
                    std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), step + 1, steps, loss,
                    tokens_per_s, lr_now, scale_now, tty ? "" : "\n");
        std::fflush(stdout);
      }
    }
    if (!save_dir.empty()) {
      // Every rank writes the bytes it stores into the shared files (at stage 3 its partitions):
      // no rank gathers the model. The weights keep the training dtype.
      auto hf = model.decoder->config();
      hf.torch_dtype = resolved.bf16.enabled.value ? "bfloat16" : resolved.fp16.enabled.value ? "float16" : "float32";
      tessera::Save16BitOptions exported;
      exported.config_json = tessera::nn::decoder_config_json(hf);
      const auto result = engine->save_16bit_model(save_dir, exported);
      if (rank == 0)
        std::printf("%ssaved the model to %s (%zu files)\n", tty ? "\n" : "", save_dir.c_str(), result.files.size());
    }
    if (rank == 0) {
      std::printf("%sdone: %d steps in %.1f s, skipped %lld%s%s\n", tty ? "\n" : "", steps,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                  static_cast<long long>(engine->skipped_steps()), csv.is_open() ? ", loss curve in " : "",
                  csv.is_open() ? csv_path.c_str() : "");
    }
    return 0;
  });
}
