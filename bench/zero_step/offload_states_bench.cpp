// offload_states_bench: what Engine::offload_states()/reload_states() move and how fast, against a
// plain copy of the same bytes measured in the same run.
//   tools/tessera-launch --nproc-per-node 2 build/bench/zero_step/offload_states_bench [--stage 3] [--dtype bf16]
//
// One engine on train_lm's TinyGpt trains two steps, then every round offloads every state and
// reloads it. Printed per rank 0 (medians over rounds): bytes moved per kind, offload_ms and
// reload_ms, the device bytes Engine::memory() counts before and while offloaded (what a colocated
// generation engine would get), and two baselines on the same bytes: memcpy into a buffer that
// exists (ratio_to_memcpy = memcpy time / offload time) and a fresh host buffer plus the copy, as
// tensor.to("cpu") does (ratio_to_alloc_copy). On a CPU-only machine "device" and host are one
// memory: the figures are the path's own cost (allocation, page faults, copies), not PCIe.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "actors/engine/engine.h"
#include "bench/common/median.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/elapsed.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace {

using tessera::bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"offload_states/reload_states: bytes moved and time, against a plain copy"};
  tessera::nn::GptConfig gpt;
  gpt.d_model = 512, gpt.n_layer = 6, gpt.n_head = 8, gpt.context = 64;
  int rounds = 9, stage = 2, micro = 2;
  std::string dtype = "bf16";
  app.add_option("--rounds", rounds, "offload/reload rounds");
  app.add_option("--stage", stage, "ZeRO stage (0-3)")->check(CLI::Range(0, 3));
  app.add_option("--dtype", dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--d-model", gpt.d_model, "model width");
  app.add_option("--layers", gpt.n_layer, "transformer blocks");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.world_size)));
  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());
  auto model = std::make_shared<tessera::nn::TinyGpt>(gpt);
  const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(micro) + "\n" +
                           (dtype == "bf16" ? "[bf16]\nenabled = true\n" : "") +
                           "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-4\n"
                           "[zero_optimization]\nstage = " + std::to_string(stage) + "\n";
  auto engine = tessera::initialize(model->module(),
                                    tessera::config::load_config_text(toml, tessera::config::Format::toml, "offload_states_bench"))
                    .engine;
  for (int k = 0; k < 2; ++k) {
    auto b = corpus.batch(1, k, 0, micro * env.world_size, gpt.context, env.rank, env.world_size);
    engine->backward(model->loss(b.tokens, b.targets));
    engine->step();
  }
  const auto before = engine->memory();
  std::vector<double> offload_ms, reload_ms, memcpy_ms, alloc_copy_ms;
  tessera::OffloadedStates moved;
  tessera::EngineMemory during;
  for (int round = 0; round < rounds; ++round) {
    auto t0 = std::chrono::steady_clock::now();
    moved = engine->offload_states();
    offload_ms.push_back(1e3 * tessera::seconds_since(t0));
    during = engine->memory();
    t0 = std::chrono::steady_clock::now();
    engine->reload_states();
    reload_ms.push_back(1e3 * tessera::seconds_since(t0));
    // The baselines, on as many bytes: into an existing buffer, and into a fresh one (as .to("cpu")).
    const auto source = at::empty({moved.total()}, at::kByte).fill_(1);
    auto target = at::empty({moved.total()}, at::kByte).fill_(0);
    t0 = std::chrono::steady_clock::now();
    std::memcpy(target.data_ptr(), source.data_ptr(), size_t(moved.total()));
    memcpy_ms.push_back(1e3 * tessera::seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    auto fresh = source.clone();
    alloc_copy_ms.push_back(1e3 * tessera::seconds_since(t0));
  }
  if (env.rank != 0) return 0;
  const double mib = 1.0 / (1 << 20);
  std::printf("{\"bench\":\"offload_states\",\"stage\":%d,\"dtype\":\"%s\",\"world\":%d,\"rounds\":%d,"
              "\"parameters_mb\":%.2f,\"gradients_mb\":%.2f,\"master_mb\":%.2f,\"optimizer_states_mb\":%.2f,"
              "\"moved_mb\":%.2f,\"device_mb_before\":%.2f,\"device_mb_offloaded\":%.2f,\"host_offloaded_mb\":%.2f,"
              "\"offload_ms\":%.2f,\"reload_ms\":%.2f,\"memcpy_ms\":%.2f,\"alloc_copy_ms\":%.2f,"
              "\"ratio_to_memcpy\":%.3f,\"ratio_to_alloc_copy\":%.3f,\"reload_ratio_to_alloc_copy\":%.3f}\n",
              stage, dtype.c_str(), env.world_size, rounds, moved.parameters * mib, moved.gradients * mib,
              moved.master_weights * mib, moved.optimizer_states * mib, moved.total() * mib, before.total() * mib,
              during.total() * mib, during.host.offloaded * mib, median(offload_ms), median(reload_ms),
              median(memcpy_ms), median(alloc_copy_ms), median(memcpy_ms) / median(offload_ms),
              median(alloc_copy_ms) / median(offload_ms), median(alloc_copy_ms) / median(reload_ms));
  return 0;
}
