// offload_step: step time with the optimizer offloaded to host memory (offload_optimizer.device =
// "cpu"), and with --nvme-path to NVMe swap files (device = "nvme"), as a ratio to the same training
// without offload, measured in the same run, interleaved.
//   tools/tessera-launch --nproc-per-node 2 build/bench/zero_step/offload_step [--stage 2] [--dtype bf16]
//       [--nvme-path /tmp] [--during-backward] [--offload-param] [--ratio 0.5]
//
// Two engines on two copies of train_lm's TinyGpt (same data, same settings but the offload key);
// every round runs each for --steps steps, the order alternating. ratio_to_no_offload is the
// median over rounds of (step time without offload) / (step time with it): 1 means offload costs
// nothing, the goal is >= 0.8 (the field's published figures are 0.18-0.83). Beside it,
// from Engine::last_step_timing(), medians per step: update_ms (the optimizer part of step()),
// offload_copy_ms (the gradients' device->host copies) and offload_wait_ms (waiting for copies the
// updates did not hide); copy_hidden_fraction = 1 - wait / (copies both ways), the weights' copies
// taken as long as the gradients' (the same bytes: both in the parameters' dtype here). And Engine::memory(): device and
// host bytes, and the process's peak RSS.
//
// NVMe (rank 0's swap file): per step the bytes read and written, the reads and writes the updates
// did not hide (swap_read_wait_ms, swap_write_wait_ms), prefetched_fraction (sub-groups whose record
// was read ahead of their update) and io_hidden_fraction = 1 - waits / (the same bytes at raw
// O_DIRECT speed, measured after the rounds in the same directory: bench/common/direct_io.h, for
// every rank's bytes, as all ranks' files share the disk); the host's swap buffers against the
// swap file's size.
//
// --during-backward adds a cpu-offload run with tessera.offload.optimizer_during_backward (each
// sub-group updated as soon as its gradients are final, during the boundary backward) and turns
// gradient clipping off in every run, since clipping needs the global norm before any update;
// updated_before_step is the median number of sub-groups that run updated before step().
//
// --offload-param (stage 3) adds a run with the parameter partitions in host memory too
// (offload_param.device = "cpu", beside cpu optimizer offload); host_parameters_mb says what moved.
// With --nvme-path as well, a run with the optimizer's states and the parameters' partitions both
// on NVMe (offload_nvme_and_parameters; offload_param buffer_size = sub_group_size, buffer_count 5);
// --during-backward with --nvme-path, a run updating the NVMe-offloaded optimizer during backward.
//
// --ratio r (< 1) adds a run with partial offload (offload_optimizer.ratio = r: the first r of each
// rank's sub-groups on the host, the rest stepped beside the parameters).
//
// On a CPU-only machine "device" and host are one memory, so the copies are real memcpys between
// distinct buffers and the update runs on the same cores either way: what the ratio measures here
// is the offload path's own overhead (copies, messages, pipelining), not PCIe.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cstdio>
#include <thread>

#include "actors/engine/engine.h"
#include "bench/common/direct_io.h"
#include "bench/common/median.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/elapsed.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace {

using tessera::bench::median;

struct Run {
  std::string name;
  std::shared_ptr<tessera::nn::TinyGpt> model;
  std::shared_ptr<tessera::Engine> engine;
  std::vector<double> step_ms;  // per round, per step
  std::vector<double> update_ms, wait_ms, copy_ms, early;  // per timed step
  std::vector<double> read_wait_ms, write_wait_ms, read_mb, write_mb, prefetched, waited;  // NVMe, per timed step
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Step time with the optimizer in host memory, as a ratio to no offload"};
  tessera::nn::GptConfig gpt;
  gpt.d_model = 256, gpt.n_layer = 4, gpt.n_head = 4, gpt.context = 64;
  int rounds = 15, steps = 2, warmup = 2, micro = 4, stage = 2, buffer_count = 4;
  int64_t sub_group = 1'000'000;
  std::string dtype = "bf16", nvme_path;
  bool during_backward = false, offload_param = false;
  double ratio = 1.0;  // offload_optimizer.ratio of the partial-offload run (1: none)
  app.add_option("--rounds", rounds, "interleaved rounds");
  app.add_option("--steps", steps, "steps per engine and round");
  app.add_option("--stage", stage, "ZeRO stage (1, 2 or 3)")->check(CLI::Range(1, 3));
  app.add_option("--dtype", dtype, "fp32 or bf16")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--d-model", gpt.d_model, "model width");
  app.add_option("--layers", gpt.n_layer, "transformer blocks");
  app.add_option("--micro-batch", micro, "sequences per rank and step");
  app.add_option("--sub-group-size", sub_group, "zero_optimization.sub_group_size (elements stepped at a time)");
  app.add_option("--buffer-count", buffer_count, "offload_optimizer.buffer_count (staging slots each way)");
  app.add_option("--nvme-path", nvme_path, "also run with offload_optimizer.device = \"nvme\" under this directory");
  app.add_flag("--during-backward", during_backward,
               "also run cpu offload with the optimizer during backward (turns gradient clipping off everywhere)");
  app.add_option("--ratio", ratio, "also run cpu optimizer offload with offload_optimizer.ratio = this (< 1)")
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--offload-param", offload_param,
               "also run cpu optimizer offload with offload_param.device = \"cpu\" (needs --stage 3)");
  CLI11_PARSE(app, argc, argv);
  if (offload_param && stage != 3) {
    std::fprintf(stderr, "offload_step: --offload-param needs --stage 3 (only ZeRO-3 partitions parameters)\n");
    return 2;
  }
  const auto env = tessera::transport::LaunchEnv::from_env();
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.world_size)));
  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());

  enum class Placement { none, cpu, cpu_during_backward, cpu_with_parameters, cpu_partial, nvme_with_parameters, nvme_during_backward, nvme };
  auto make = [&](Placement placement) {
    Run r;
    r.name = placement == Placement::none                  ? "no_offload"
             : placement == Placement::cpu                 ? "offload_cpu"
             : placement == Placement::cpu_during_backward ? "offload_cpu_during_backward"
             : placement == Placement::cpu_with_parameters ? "offload_cpu_and_parameters"
             : placement == Placement::cpu_partial         ? "offload_cpu_partial"
             : placement == Placement::nvme_with_parameters ? "offload_nvme_and_parameters"
             : placement == Placement::nvme_during_backward ? "offload_nvme_during_backward"
                                                           : "offload_nvme";
    const bool nvme = placement == Placement::nvme || placement == Placement::nvme_with_parameters ||
                      placement == Placement::nvme_during_backward;
    // Each NVMe run's swap files in a directory of its own: the engines live at once, and a swap
    // file is locked by the engine that made it.
    const std::string swap_dir = nvme_path + "/" + r.name;
    if (nvme) std::filesystem::create_directories(swap_dir);
    r.model = std::make_shared<tessera::nn::TinyGpt>(gpt);
    std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(micro) + "\ngradient_clipping = " +
                       (during_backward ? "0.0" : "1.0") + "\n" +
                       (dtype == "bf16" ? "[bf16]\nenabled = true\n" : "") +
                       "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-4\nweight_decay = 0.01\n"
                       "[zero_optimization]\nstage = " + std::to_string(stage) +
                       "\noverlap_comm = true\nsub_group_size = " + std::to_string(sub_group) +
                       "\nreduce_bucket_size = " + std::to_string(gpt.d_model * gpt.d_model) + "\n";
    if (placement != Placement::none)
      toml += std::string("[zero_optimization.offload_optimizer]\ndevice = \"") +
              (nvme ? "nvme" : "cpu") + "\"\npin_memory = true\nbuffer_count = " +
              std::to_string(buffer_count) + "\n";
    if (placement == Placement::cpu_partial) toml += "ratio = " + std::to_string(ratio) + "\n";
    if (nvme) toml += "nvme_path = \"" + swap_dir + "\"\n";
    if (placement == Placement::nvme_with_parameters)
      toml += "[zero_optimization.offload_param]\ndevice = \"nvme\"\nnvme_path = \"" + swap_dir +
              "\"\nbuffer_count = 5\nbuffer_size = " + std::to_string(sub_group) + "\n";
    if (placement == Placement::cpu_during_backward || placement == Placement::nvme_during_backward)
      toml += "[tessera.offload]\noptimizer_during_backward = true\n";
    if (placement == Placement::cpu_with_parameters)
      toml += "[zero_optimization.offload_param]\ndevice = \"cpu\"\npin_memory = true\n";
    r.engine = tessera::initialize(r.model->module(),
                                   tessera::config::load_config_text(toml, tessera::config::Format::toml, "offload_step"))
                   .engine;
    return r;
  };
  std::vector<Run> runs;
  runs.push_back(make(Placement::none));
  runs.push_back(make(Placement::cpu));
  if (during_backward) runs.push_back(make(Placement::cpu_during_backward));
  if (offload_param) runs.push_back(make(Placement::cpu_with_parameters));
  if (ratio < 1.0) runs.push_back(make(Placement::cpu_partial));
  if (!nvme_path.empty() && offload_param) runs.push_back(make(Placement::nvme_with_parameters));
  if (!nvme_path.empty() && during_backward) runs.push_back(make(Placement::nvme_during_backward));
  if (!nvme_path.empty()) runs.push_back(make(Placement::nvme));  // last: the NVMe line below reads it
  int64_t parameters = 0;
  for (const auto& p : runs[0].model->module()->parameters()) parameters += p.numel();
  auto step = [&](Run& r, int64_t k) {
    auto b = corpus.batch(1, k, 0, micro * env.world_size, gpt.context, env.rank, env.world_size);
    r.engine->backward(r.model->loss(b.tokens, b.targets));
    r.engine->step();
  };
  for (auto& r : runs)
    for (int k = 0; k < warmup; ++k) step(r, k);
  for (int round = 0; round < rounds; ++round)
    for (size_t j = 0; j < runs.size(); ++j) {
      auto& r = runs[(j + size_t(round)) % runs.size()];
      double total = 0;
      for (int k = 0; k < steps; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        step(r, warmup + round * steps + k);
        total += tessera::seconds_since(t0);
        const auto t = r.engine->last_step_timing();
        r.update_ms.push_back(1e3 * t.update_s);
        r.wait_ms.push_back(1e3 * t.offload_wait_s);
        r.copy_ms.push_back(1e3 * t.offload_copy_s);
        r.early.push_back(double(t.updated_before_step));
        r.read_wait_ms.push_back(1e3 * t.swap.read_wait_s), r.write_wait_ms.push_back(1e3 * t.swap.write_wait_s);
        r.read_mb.push_back(double(t.swap.bytes_read) / (1 << 20)), r.write_mb.push_back(double(t.swap.bytes_written) / (1 << 20));
        r.prefetched.push_back(double(t.swap.prefetched)), r.waited.push_back(double(t.swap.waited_reads));
      }
      r.step_ms.push_back(1e3 * total / steps);
    }
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  if (env.rank != 0) return 0;
  const double mib = 1.0 / (1 << 20);
  for (const auto& r : runs) {
    std::vector<double> ratios;
    for (int i = 0; i < rounds; ++i) ratios.push_back(runs[0].step_ms[size_t(i)] / r.step_ms[size_t(i)]);
    const auto m = r.engine->memory();
    // Gradients and weights share the dtype here: as many bytes go back as came over.
    const double copies = 2 * median(r.copy_ms);
    const double hidden = copies > 0 ? std::max(0.0, 1 - median(r.wait_ms) / copies) : 0;
    std::printf("{\"bench\":\"offload_step\",\"config\":\"%s\",\"stage\":%d,\"dtype\":\"%s\",\"world\":%d,"
                "\"parameters\":%lld,\"sub_group_size\":%lld,\"buffer_count\":%d,\"rounds\":%d,\"steps_per_round\":%d,"
                "\"step_ms\":%.2f,\"min_step_ms\":%.2f,\"ratio_to_no_offload\":%.3f,\"update_ms\":%.2f,"
                "\"offload_copy_ms\":%.3f,\"offload_wait_ms\":%.3f,\"copy_hidden_fraction\":%.3f,"
                "\"device_mb\":%.2f,\"device_master_mb\":%.2f,\"device_states_mb\":%.2f,"
                "\"host_parameters_mb\":%.2f,\"host_master_mb\":%.2f,\"host_states_mb\":%.2f,\"host_staging_mb\":%.2f,"
                "\"host_swap_buffers_mb\":%.2f,\"nvme_mb\":%.2f,\"peak_rss_mb\":%.1f,"
                "\"gradient_clipping\":%s,\"updated_before_step\":%.1f,\"ratio\":%.3f}\n",
                r.name.c_str(), stage, dtype.c_str(), env.world_size, static_cast<long long>(parameters),
                static_cast<long long>(sub_group), buffer_count, rounds, steps, median(r.step_ms),
                *std::min_element(r.step_ms.begin(), r.step_ms.end()), median(ratios),
                median(r.update_ms), median(r.copy_ms), median(r.wait_ms), hidden, m.total() * mib, m.master * mib,
                m.optimizer_states * mib, m.host.parameters * mib, m.host.master * mib, m.host.optimizer_states * mib, m.host.staging * mib,
                m.host.swap_buffers * mib, m.nvme * mib, double(u.ru_maxrss) / 1024.0, during_backward ? "0.0" : "1.0", median(r.early),
                r.name == "offload_cpu_partial" ? ratio : r.name == "no_offload" ? 0.0 : 1.0);
  }
  if (nvme_path.empty()) return 0;
  const auto& r = runs.back();
  const auto m = r.engine->memory();
  const auto raw = tessera::bench::raw_direct_io(nvme_path + "/offload_step_baseline.raw", std::max<int64_t>(m.nvme, 64 << 20), 1 << 20);
  // Every rank's swap file is on the one disk and all move the same bytes at once: the disk moves
  // world_size times rank 0's bytes in a step.
  const double read_ms = env.world_size * median(r.read_mb) / mib / 1e6 / raw.read_gbps();
  const double write_ms = env.world_size * median(r.write_mb) / mib / 1e6 / raw.write_gbps();
  const double waits = median(r.read_wait_ms) + median(r.write_wait_ms);
  const double sub_groups = median(r.prefetched) + median(r.waited);
  std::printf("{\"bench\":\"offload_step_nvme\",\"stage\":%d,\"dtype\":\"%s\",\"world\":%d,\"nvme_path\":\"%s\","
              "\"swap_read_mb\":%.2f,\"swap_write_mb\":%.2f,\"swap_read_wait_ms\":%.3f,\"swap_write_wait_ms\":%.3f,"
              "\"raw_read_gbps\":%.3f,\"raw_write_gbps\":%.3f,\"io_at_raw_speed_ms\":%.3f,\"io_hidden_fraction\":%.3f,"
              "\"prefetched_fraction\":%.3f,\"host_swap_buffers_mb\":%.2f,\"nvme_mb\":%.2f,\"fsyncs\":0}\n",
              stage, dtype.c_str(), env.world_size, nvme_path.c_str(), median(r.read_mb), median(r.write_mb),
              median(r.read_wait_ms), median(r.write_wait_ms), raw.read_gbps(), raw.write_gbps(), read_ms + write_ms,
              read_ms + write_ms > 0 ? std::clamp(1 - waits / (read_ms + write_ms), 0.0, 1.0) : 0.0,
              sub_groups > 0 ? median(r.prefetched) / sub_groups : 0.0, m.host.swap_buffers * mib, m.nvme * mib);
  return 0;
}
