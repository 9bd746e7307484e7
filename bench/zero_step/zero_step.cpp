// zero_step: time of one optimizer step of stages 0, 1 and 2 on train_lm's model, each as a ratio
// to stage 0 measured in the same run, and the fraction of gradient-reduction time hidden behind
// backward by overlap_comm. Launch on 2 ranks:
//   tools/tessera-launch --nproc-per-node 2 build/bench/zero_step/zero_step [--steps 8]
// Rank 0 prints one JSON line per (stage, overlap_comm).
//
// hidden_fraction = 1 - wait_on / wait_off, where wait is the time step() spends waiting for
// reductions still running when backward ended (the part not hidden): with overlap off every
// reduction starts at the end of backward, so wait_off is the whole reduction time. gradient_mb is the gradient memory per rank right after backward.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace {


double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Measure {
  double step_s = 0, wait_s = 0, update_s = 0, gather_s = 0;
  double gradient_mb = 0;  // gradient memory per rank after backward (Engine::memory())
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ZeRO step time per stage, as a ratio to stage 0"};
  int steps = 8, warmup = 2, micro = 8;
  tessera::nn::GptConfig model_config;
  model_config.d_model = 128, model_config.n_layer = 4, model_config.n_head = 4, model_config.context = 64;
  app.add_option("--steps", steps, "timed steps per configuration");
  app.add_option("--micro-batch", micro, "sequences per rank");
  app.add_option("--d-model", model_config.d_model, "model width");
  std::vector<int> stages{0, 1, 2};
  app.add_option("--stages", stages, "stages to measure (stage 0 is the baseline and always runs)");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  const int rank = env.rank, world = env.world_size;
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, world)));
  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());

  auto measure = [&](int stage, bool overlap) {
    tessera::nn::TinyGpt model(model_config);
    const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(micro) +
                             "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-3\n"
                             "[zero_optimization]\nstage = " + std::to_string(stage) +
                             "\noverlap_comm = " + (overlap ? "true" : "false") +
                             "\nreduce_bucket_size = " + std::to_string(model_config.d_model * model_config.d_model) + "\n";
    auto engine = tessera::initialize(model.module(),
                                      tessera::config::load_config_text(toml, tessera::config::Format::toml, "zero_step"))
                      .engine;
    std::vector<double> step_s, wait_s, update_s, gather_s;
    double gradient_mb = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      auto batch = corpus.batch(1, s, 0, micro * world, model_config.context, rank, world);
      const auto t0 = std::chrono::steady_clock::now();
      engine->backward(model.loss(batch.tokens, batch.targets));
      gradient_mb = engine->memory().gradients / 1e6;
      engine->step();
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (s < warmup) continue;
      const auto timing = engine->last_step_timing();
      step_s.push_back(dt), wait_s.push_back(timing.reduction_wait_s), update_s.push_back(timing.update_s),
          gather_s.push_back(timing.gather_s);
    }
    return Measure{median(step_s), median(wait_s), median(update_s), median(gather_s), gradient_mb};
  };

  int64_t parameters = 0;
  {
    tessera::nn::TinyGpt probe(model_config);
    for (const auto& p : probe.module()->parameters()) parameters += p.numel();
  }
  double stage0_step = 0;
  if (std::find(stages.begin(), stages.end(), 0) == stages.end()) stages.insert(stages.begin(), 0);
  for (int stage : stages) {
    const Measure off = measure(stage, false), on = measure(stage, true);
    if (stage == 0) stage0_step = on.step_s;
    if (rank != 0) continue;
    for (const auto* m : {&off, &on}) {
      const bool overlap = m == &on;
      std::printf("{\"bench\":\"zero_step\",\"stage\":%d,\"overlap_comm\":%s,\"world\":%d,\"parameters\":%lld,"
                  "\"micro_batch\":%d,\"step_ms\":%.2f,\"ratio_to_stage0\":%.3f,\"reduction_wait_ms\":%.2f,"
                  "\"update_ms\":%.2f,\"gather_ms\":%.2f,\"gradient_mb\":%.2f%s}\n",
                  stage, overlap ? "true" : "false", world, static_cast<long long>(parameters), micro,
                  1e3 * m->step_s, m->step_s / stage0_step, 1e3 * m->wait_s, 1e3 * m->update_s, 1e3 * m->gather_s,
                  m->gradient_mb, overlap ? (",\"hidden_fraction\":" +
                             std::to_string(off.wait_s > 0 ? std::max(0.0, 1.0 - on.wait_s / off.wait_s) : 0.0))
                                .c_str()
                          : "");
    }
    std::fflush(stdout);
  }
  return 0;
}
