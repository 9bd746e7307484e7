// zero_step: time of one optimizer step of ZeRO stages 0, 1, 2 and 3 on a TinyGpt, each as a ratio
// to stage 0 measured in the same run, interleaved; the fraction of gradient-reduction time hidden
// behind backward by overlap_comm; and each stage's memory per rank, counted by a c10 CPU
// allocator. Launch on 2 ranks:
//   tools/tessera-launch --nproc-per-node 2 --master-port 29940 build/bench/zero_step/zero_step
//   ... zero_step --skip-memory --stages 0 2 3 --overlap on --rounds 30 --steps 1   # the ratios only
//
// Time (rank 0 prints one "zero_step" line per (stage, overlap_comm, prefetch)): every
// configuration has its own model and engine, all built up front; every round runs each of them
// for --steps steps, the order rotating from round to round (the machine's load drifts), and
// ratio_to_stage0 is the median over rounds of (the configuration's mean step time in the round) /
// (stage 0 with overlap_comm's, same round); cpu_ratio_to_stage0 the same with the CPU time of the
// process (every thread: steadier than wall time when other jobs share the cores);
// round_ratio_range the lowest and highest per-round ratio; ratio_of_min_steps the fastest step
// over stage 0's fastest (the least disturbed by other jobs). Fewer configurations (--stages,
// --overlap on) and short rounds (--steps 1) keep the compared runs close in time. step_ms and its
// parts (forward + backward, the step() call, and inside step() what the engine reports: reduction
// wait, update, post-update gather) are medians over all timed steps.
// hidden_fraction = 1 - wait_on / wait_off, where wait is the time step() spends waiting for
// reductions still running when backward ended (the part not hidden): with overlap off every
// reduction starts at the end of backward, so wait_off is the whole reduction time.
//
// ZeRO-3 gathers each unit (a module owning partitioned parameters) before its forward and again
// before its backward; with prefetch (stage3_prefetch_bucket_size > 0) the next units of the
// recorded order are gathered ahead while the current one computes. Stage 3 is timed both ways
// (--prefetch both|on|off; off = bucket 0). From the engine's Stage3Stats, read between steps:
// fetch_wait_ms, the median per step of the time the training thread waited for gathers, and
// fetch_wait_fraction, their sum over the sum of step times; fetches_per_step and
// prefetched_fraction (fetches whose unit was already on its way). gather_all_units_ms: the time
// to open engine->gathered_parameters() on every unit, fetched one after another as a forward
// without prefetch does; est_gather_fraction = 2 x that / step_ms (two gathers of every unit per
// step; the persistent parameters' post-update gather is gather_ms). That scope fetches in unit
// order, not the forward's, so engines with prefetch say once that the window "left the recorded
// module order": expected here.
//
// Memory (every rank prints one "zero_memory" line per stage, measured before the timed engines
// exist, one stage at a time; stage 3 with prefetch unless --prefetch off): every tensor
// allocation of the process goes through a counting allocator (c10::SetCPUAllocator); in MiB,
// relative to what was live before the stage's model was built:
//   live_mb       between steps: the model's parameters and everything the engine keeps
//   peak_fwd_bwd_mb / peak_step_mb  the highest live bytes during forward + backward (parameters,
//                 gathered units, activations, gradients, staging) / during step()
//   peak_init_mb  during initialize() (stage 3 starts from the full model the caller built)
//   peak_gathered_mb  stage 3: the most unit storage gathered at once (Stage3Stats), next to
//                 max_live_mb and prefetch_bucket_mb (the settings, capped at the model's size)
// and Engine::memory() between steps (engine_parameters_mb: the weight buffers, at stage 3 the
// partition and the persistent parameters, plus gathered units: none between steps; engine_scratch_mb:
// the reducer's clipping scratch, min(largest partition, 2^20) doubles, and the optimizer's
// workspace, one partition from the first step). other_mb = live_mb - Engine::memory()'s total:
// what the engine does not report, found with this allocator: Gloo's cached buffers (at stage 3
// one per distinct unit-segment size) and small bookkeeping.
#include <CLI/CLI.hpp>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "actors/engine/engine.h"
#include "bench/common/counting_allocator.h"
#include "bench/common/median.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/elapsed.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace {

// The counting CPU allocator: bench/common/counting_allocator.h.
using tessera::bench::CountingAllocator;
using tessera::bench::g_live;
using tessera::bench::g_peak;
using tessera::seconds_since;
using tessera::bench::reset_peak;

// Waits (up to 2 s) for the live bytes to stop falling: engines shut their actors down asynchronously.
void settle() {
  int64_t last = g_live.load();
  for (int i = 0; i < 40; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int64_t now = g_live.load();
    if (now == last && i >= 4) return;
    last = now;
  }
}

// ---- measurement ----------------------------------------------------------------------------

using tessera::bench::median;

double min_of(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }

double cpu_seconds() {  // every thread of the process (the actors' and Gloo's included)
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

struct Run {
  int stage = 0;
  bool overlap = true;
  bool prefetch = false;  // stage 3: stage3_prefetch_bucket_size as configured (else 0: none)
  std::shared_ptr<tessera::nn::TinyGpt> model;
  std::shared_ptr<tessera::Engine> engine;
  double gradient_mb = 0;  // Engine::memory().gradients after a backward (untimed)
  std::vector<double> step_s, fwd_bwd_s, step_call_s, wait_s, update_s, gather_s;  // per timed step
  std::vector<double> fetch_wait_s;  // stage 3, per timed step: Stage3Stats::fetch_wait_s's increase
  int64_t fetches = 0, prefetched = 0;  // stage 3, over the timed steps
  std::vector<double> round_s, round_cpu_s;  // per round: mean wall and CPU time per step
};

}  // namespace

int main(int argc, char** argv) {
  static CountingAllocator counting;
  c10::SetCPUAllocator(&counting, /*priority=*/100);

  CLI::App app{"ZeRO step time (ratio to stage 0) and memory per rank, stages 0-3"};
  int rounds = 5, steps = 3, warmup = 2, micro = 8, memory_steps = 2;
  int64_t threshold = 1000;
  tessera::nn::GptConfig model_config;
  model_config.d_model = 256, model_config.n_layer = 4, model_config.n_head = 4, model_config.context = 64;
  app.add_option("--rounds", rounds, "interleaved rounds");
  app.add_option("--steps", steps, "timed steps per configuration and round");
  app.add_option("--micro-batch", micro, "sequences per rank");
  app.add_option("--d-model", model_config.d_model, "model width");
  app.add_option("--layers", model_config.n_layer, "transformer blocks");
  app.add_option("--context", model_config.context, "tokens per sequence");
  app.add_option("--persistence-threshold", threshold,
                 "stage 3's stage3_param_persistence_threshold (elements; the default keeps only LayerNorm vectors whole)");
  std::vector<int> stages{0, 1, 2, 3};
  app.add_option("--stages", stages, "stages to measure (stage 0 is the baseline and always runs)");
  std::string overlap_modes = "both", prefetch_modes = "both";
  int64_t prefetch_bucket = 50'000'000;
  app.add_option("--prefetch", prefetch_modes, "stage 3 timed with prefetch (on), without (off: bucket 0) or both")
      ->check(CLI::IsMember({"both", "on", "off"}));
  app.add_option("--prefetch-bucket", prefetch_bucket, "stage3_prefetch_bucket_size with prefetch on (elements)");
  int64_t reuse_distance = 1'000'000'000;  // DeepSpeed's default
  app.add_option("--reuse-distance", reuse_distance, "stage3_max_reuse_distance (elements; 0: release after every use)");
  int64_t max_live = 1'000'000'000;  // DeepSpeed's default
  app.add_option("--max-live", max_live, "stage3_max_live_parameters (elements)");
  app.add_option("--overlap", overlap_modes, "overlap_comm settings timed: both (and hidden_fraction), on, off")
      ->check(CLI::IsMember({"both", "on", "off"}));
  bool skip_memory = false, skip_time = false;
  app.add_flag("--skip-memory", skip_memory, "time only");
  app.add_flag("--skip-time", skip_time, "memory only");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  const int rank = env.rank, world = env.world_size;
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.local_world_size)));
  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());
  if (std::find(stages.begin(), stages.end(), 0) == stages.end()) stages.insert(stages.begin(), 0);

  int64_t parameters = 0;
  {
    tessera::nn::TinyGpt probe(model_config);
    for (const auto& p : probe.module()->parameters()) parameters += p.numel();
  }
  auto make_engine = [&](int stage, bool overlap, bool prefetch, tessera::nn::TinyGpt& model) {
    std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(micro) +
                       "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-3\n"
                       "[zero_optimization]\nstage = " + std::to_string(stage) +
                       "\noverlap_comm = " + (overlap ? "true" : "false") +
                       "\nreduce_bucket_size = " + std::to_string(model_config.d_model * model_config.d_model) + "\n";
    if (stage == 3)
      toml += "stage3_param_persistence_threshold = " + std::to_string(threshold) +
              "\nstage3_prefetch_bucket_size = " + std::to_string(prefetch ? prefetch_bucket : 0) +
              "\nstage3_max_reuse_distance = " + std::to_string(reuse_distance) +
              "\nstage3_max_live_parameters = " + std::to_string(max_live) + "\n";
    return tessera::initialize(model.module(),
                               tessera::config::load_config_text(toml, tessera::config::Format::toml, "zero_step"))
        .engine;
  };
  auto forward_backward = [&](tessera::Engine& engine, tessera::nn::TinyGpt& model, int64_t k) {
    auto batch = corpus.batch(1, k, 0, micro * world, model_config.context, rank, world);
    engine.backward(engine.forward([&] { return model.loss(batch.tokens, batch.targets); }));
  };
  const double mb = 1.0 / (1 << 20);

  // ---- memory, one stage at a time ----
  if (!skip_memory) {
    for (int stage : stages) {
      settle();
      const int64_t base = g_live.load();
      double init_peak = 0, fwd_bwd_peak = 0, step_peak = 0, live = 0;
      tessera::EngineMemory em;
      tessera::Stage3Stats s3;
      {
        reset_peak();
        auto model = std::make_shared<tessera::nn::TinyGpt>(model_config);
        auto engine = make_engine(stage, true, prefetch_modes != "off", *model);
        init_peak = double(g_peak.load() - base);
        for (int s = 0; s < warmup + memory_steps; ++s) {
          reset_peak();
          forward_backward(*engine, *model, s);
          if (s >= warmup) fwd_bwd_peak = std::max(fwd_bwd_peak, double(g_peak.load() - base));
          reset_peak();
          engine->step();
          if (s >= warmup) step_peak = std::max(step_peak, double(g_peak.load() - base));
        }
        settle();
        live = double(g_live.load() - base);
        em = engine->memory();
        s3 = engine->stage3_stats();
      }
      std::printf("{\"bench\":\"zero_memory\",\"stage\":%d,\"rank\":%d,\"world\":%d,\"parameters\":%lld,"
                  "\"micro_batch\":%d,\"persistence_threshold\":%lld,\"live_mb\":%.2f,\"peak_fwd_bwd_mb\":%.2f,"
                  "\"peak_step_mb\":%.2f,\"peak_init_mb\":%.2f,\"engine_parameters_mb\":%.2f,"
                  "\"engine_gradients_mb\":%.2f,\"engine_master_mb\":%.2f,\"engine_states_mb\":%.2f,"
                  "\"engine_scratch_mb\":%.2f,\"other_mb\":%.2f,\"fp32_model_mb\":%.2f,\"peak_gathered_mb\":%.2f,\"max_live_mb\":%.2f,"
                  "\"prefetch_bucket_mb\":%.2f,\"reuse_distance\":%lld}\n",
                  stage, rank, world, static_cast<long long>(parameters), micro,
                  static_cast<long long>(stage == 3 ? threshold : -1), live * mb, fwd_bwd_peak * mb, step_peak * mb,
                  init_peak * mb, double(em.parameters) * mb, double(em.gradients) * mb, double(em.master) * mb,
                  double(em.optimizer_states) * mb, double(em.scratch) * mb, (live - double(em.total())) * mb,
                  double(parameters) * 4 * mb, double(s3.peak_gathered_bytes) * mb,
                  double(std::min<int64_t>(max_live, parameters)) * 4 * mb,
                  double(prefetch_modes != "off" ? std::min<int64_t>(prefetch_bucket, parameters) : 0) * 4 * mb,
                  static_cast<long long>(reuse_distance));
      std::fflush(stdout);
    }
  }
  if (skip_time) return 0;

  // ---- time, interleaved ----
  std::vector<Run> runs;
  std::vector<bool> overlaps;
  if (overlap_modes != "on") overlaps.push_back(false);
  if (overlap_modes != "off") overlaps.push_back(true);
  std::vector<bool> prefetches;  // stage 3
  if (prefetch_modes != "on") prefetches.push_back(false);
  if (prefetch_modes != "off") prefetches.push_back(true);
  for (int stage : stages)
    for (bool overlap : overlaps)
      for (bool prefetch : stage == 3 ? prefetches : std::vector<bool>{false}) {
        Run r;
        r.stage = stage, r.overlap = overlap, r.prefetch = prefetch;
        r.model = std::make_shared<tessera::nn::TinyGpt>(model_config);
        r.engine = make_engine(stage, overlap, prefetch, *r.model);
        runs.push_back(std::move(r));
      }
  size_t baseline = 0;  // stage 0 with overlap_comm (without, when only that is timed)
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].stage == 0 && runs[i].overlap == overlaps.back()) baseline = i;
  for (auto& r : runs)
    for (int s = 0; s < warmup; ++s) {
      forward_backward(*r.engine, *r.model, s);
      if (s + 1 == warmup) r.gradient_mb = double(r.engine->memory().gradients) / 1e6;
      r.engine->step();
    }
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < runs.size(); ++j) {
      auto& r = runs[(j + size_t(round)) % runs.size()];
      double total = 0, cpu = 0;
      for (int k = 0; k < steps; ++k) {
        const auto before = r.engine->stage3_stats();  // asks the parameter-shard: outside the timed part
        const double c0 = cpu_seconds();
        const auto t0 = std::chrono::steady_clock::now();
        forward_backward(*r.engine, *r.model, warmup + round * steps + k);
        const double fb = seconds_since(t0);
        const auto t1 = std::chrono::steady_clock::now();
        r.engine->step();
        const double st = seconds_since(t1);
        cpu += cpu_seconds() - c0;
        const auto timing = r.engine->last_step_timing();
        r.step_s.push_back(fb + st), r.fwd_bwd_s.push_back(fb), r.step_call_s.push_back(st);
        r.wait_s.push_back(timing.reduction_wait_s), r.update_s.push_back(timing.update_s),
            r.gather_s.push_back(timing.gather_s);
        total += fb + st;
        const auto after = r.engine->stage3_stats();
        r.fetch_wait_s.push_back(after.fetch_wait_s - before.fetch_wait_s);
        r.fetches += after.fetches - before.fetches, r.prefetched += after.prefetched - before.prefetched;
      }
      r.round_s.push_back(total / steps);
      r.round_cpu_s.push_back(cpu / steps);
    }
  }
  // ZeRO-3: one blocking gather of every unit, as a forward does them (collective: every rank).
  std::vector<double> gather_all_s(runs.size(), 0);
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].stage != 3) continue;
    std::vector<double> t;
    for (int k = 0; k < 5; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      auto gathered = runs[i].engine->gathered_parameters();
      t.push_back(seconds_since(t0));
    }
    gather_all_s[i] = median(t);
  }
  if (rank != 0) return 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    const auto& r = runs[i];
    std::vector<double> ratios, cpu_ratios, cpu_ms;
    for (int round = 0; round < rounds; ++round) {
      ratios.push_back(r.round_s[size_t(round)] / runs[baseline].round_s[size_t(round)]);
      cpu_ratios.push_back(r.round_cpu_s[size_t(round)] / runs[baseline].round_cpu_s[size_t(round)]);
      cpu_ms.push_back(1e3 * r.round_cpu_s[size_t(round)]);
    }
    const Run* off = nullptr;
    for (const auto& o : runs)
      if (o.stage == r.stage && !o.overlap && o.prefetch == r.prefetch) off = &o;
    std::string extra;
    if (r.overlap && off) {
      const double w_off = median(off->wait_s), w_on = median(r.wait_s);
      extra += ",\"hidden_fraction\":" + std::to_string(w_off > 0 ? std::max(0.0, 1.0 - w_on / w_off) : 0.0);
    }
    if (r.stage == 3) {
      char buf[512];
      double fetch_wait = 0;
      for (double w : r.fetch_wait_s) fetch_wait += w;
      double total = 0;
      for (double t : r.step_s) total += t;
      std::snprintf(buf, sizeof buf,
                    ",\"prefetch_bucket\":%lld,\"reuse_distance\":%lld,\"persistence_threshold\":%lld,\"fetch_wait_ms\":%.2f,"
                    "\"fetch_wait_fraction\":%.3f,\"fetches_per_step\":%.1f,\"prefetched_fraction\":%.3f,"
                    "\"gather_all_units_ms\":%.2f,\"est_gather_fraction\":%.3f",
                    static_cast<long long>(r.prefetch ? prefetch_bucket : 0), static_cast<long long>(reuse_distance),
                    static_cast<long long>(threshold),
                    1e3 * median(r.fetch_wait_s), total > 0 ? fetch_wait / total : 0.0,
                    r.step_s.empty() ? 0.0 : double(r.fetches) / double(r.step_s.size()),
                    r.fetches > 0 ? double(r.prefetched) / double(r.fetches) : 0.0, 1e3 * gather_all_s[i],
                    2 * gather_all_s[i] / median(r.step_s));
      extra += buf;
    }
    std::printf("{\"bench\":\"zero_step\",\"stage\":%d,\"overlap_comm\":%s,\"world\":%d,\"parameters\":%lld,"
                "\"d_model\":%lld,\"layers\":%lld,\"micro_batch\":%d,\"context\":%lld,\"rounds\":%d,\"steps_per_round\":%d,"
                "\"step_ms\":%.2f,\"ratio_to_stage0\":%.3f,\"round_ratio_range\":[%.3f,%.3f],"
                "\"min_step_ms\":%.2f,\"ratio_of_min_steps\":%.3f,"
                "\"cpu_ms\":%.2f,\"cpu_ratio_to_stage0\":%.3f,"
                "\"fwd_bwd_ms\":%.2f,\"step_call_ms\":%.2f,\"reduction_wait_ms\":%.2f,\"update_ms\":%.2f,"
                "\"gather_ms\":%.2f,\"gradient_mb\":%.2f%s}\n",
                r.stage, r.overlap ? "true" : "false", world, static_cast<long long>(parameters),
                static_cast<long long>(model_config.d_model), static_cast<long long>(model_config.n_layer), micro,
                static_cast<long long>(model_config.context), rounds, steps, 1e3 * median(r.step_s), median(ratios),
                *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                1e3 * min_of(r.step_s), min_of(r.step_s) / min_of(runs[baseline].step_s), median(cpu_ms), median(cpu_ratios),
                1e3 * median(r.fwd_bwd_s), 1e3 * median(r.step_call_s), 1e3 * median(r.wait_s),
                1e3 * median(r.update_s), 1e3 * median(r.gather_s), r.gradient_mb, extra.c_str());
  }
  std::fflush(stdout);
  return 0;
}
