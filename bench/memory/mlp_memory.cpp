// mlp_memory: trains nn::Mlp with the engine at one ZeRO stage and reports this process's
// resident memory (VmRSS) every --sample-every steps and its peak (VmHWM) at the end, one JSON
// line each, from every rank. run_memory_bench.py runs it per stage and turns the lines into the
// results (stage 2's saving against stage 1's peak, growth of RSS after warm-up).
//   tools/tessera-launch --nproc-per-node 2 build/bench/memory/mlp_memory --width 4096 --stage 2 --steps 4
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <string>
#include <thread>

#include "actors/engine/engine.h"
#include "bench/common/process_memory.h"
#include "core/config/load.h"
#include "core/nn/mlp.h"
#include "transport/launch_env.h"

int main(int argc, char** argv) {
  CLI::App app{"Resident memory of the engine training an MLP"};
  tessera::nn::MlpConfig model;
  int stage = 2, steps = 4, sample_every = 1, batch = 32;
  int64_t bucket = 2'000'000;
  std::string precision = "fp32";
  app.add_option("--width", model.width, "hidden width");
  app.add_option("--layers", model.layers, "hidden layers");
  app.add_option("--input", model.input, "input features");
  app.add_option("--output", model.output, "outputs");
  app.add_option("--stage", stage, "ZeRO stage")->check(CLI::Range(0, 3));
  app.add_option("--steps", steps, "optimizer steps");
  app.add_option("--batch", batch, "rows per rank and step");
  app.add_option("--bucket", bucket, "reduce_bucket_size (elements)");
  app.add_option("--sample-every", sample_every, "steps between RSS samples");
  // Stage 3's bounds; unset: the config's defaults (DeepSpeed's).
  int64_t max_live = -1, reuse_distance = -1, prefetch_bucket = -1;
  app.add_option("--max-live", max_live, "stage3_max_live_parameters (elements)");
  app.add_option("--reuse-distance", reuse_distance, "stage3_max_reuse_distance (elements)");
  app.add_option("--prefetch-bucket", prefetch_bucket, "stage3_prefetch_bucket_size (elements)");
  app.add_option("--precision", precision, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.world_size)));

  tessera::nn::Mlp mlp(model);
  const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(batch) + "\n" +
                           (precision == "bf16" ? "[bf16]\nenabled = true\n" : "") +
                           "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-4\n"
                           "[zero_optimization]\nstage = " + std::to_string(stage) +
                           "\noverlap_comm = true\nreduce_bucket_size = " + std::to_string(bucket) + "\n" +
                           (max_live >= 0 ? "stage3_max_live_parameters = " + std::to_string(max_live) + "\n" : "") +
                           (reuse_distance >= 0 ? "stage3_max_reuse_distance = " + std::to_string(reuse_distance) + "\n" : "") +
                           (prefetch_bucket >= 0 ? "stage3_prefetch_bucket_size = " + std::to_string(prefetch_bucket) + "\n" : "");
  auto engine = tessera::initialize(mlp.module(), tessera::config::load_config_text(toml, tessera::config::Format::toml, "mlp_memory")).engine;
  auto line = [&](const char* kind, int step) {
    const auto m = engine->memory();
    std::printf("{\"bench\":\"mlp_memory\",\"kind\":\"%s\",\"rank\":%d,\"world\":%d,\"stage\":%d,\"precision\":\"%s\","
                "\"parameters\":%lld,\"bucket_elements\":%lld,\"step\":%d,\"rss_mb\":%.1f,\"peak_mb\":%.1f,"
                "\"engine_parameters_mb\":%.1f,\"engine_gradients_mb\":%.1f,\"engine_master_mb\":%.1f,"
                "\"engine_states_mb\":%.1f}\n",
                kind, env.rank, env.world_size, stage, precision.c_str(),
                static_cast<long long>(tessera::nn::mlp_parameter_count(model)), static_cast<long long>(bucket), step,
                tessera::bench::status_mib("VmRSS"), tessera::bench::status_mib("VmHWM"), m.parameters / 1e6, m.gradients / 1e6, m.master / 1e6,
                m.optimizer_states / 1e6);
    std::fflush(stdout);
  };
  for (int step = 0; step < steps; ++step) {
    engine->backward(mlp.loss(batch, 11, step, env.rank));
    engine->step();
    if ((step + 1) % sample_every == 0) line("sample", step + 1);
  }
  line("peak", steps);
  return 0;
}
