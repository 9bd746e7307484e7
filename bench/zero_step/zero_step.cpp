// zero_step: time of one optimizer step of ZeRO stages 0, 1, 2 and 3 on a TinyGpt, each as a ratio
// to stage 0 measured in the same run, interleaved; the fraction of gradient-reduction time hidden
// behind backward by overlap_comm; and each stage's memory per rank, counted by a c10 CPU
// allocator. Launch on 2 ranks:
//   tools/tessera-launch --nproc-per-node 2 --master-port 29940 build/bench/zero_step/zero_step [--rounds 5]
//
// Time (rank 0 prints one "zero_step" line per (stage, overlap_comm)): every configuration has its
// own model and engine, all built up front; every round runs each of them for --steps steps, the
// order rotating from round to round (the machine's load drifts), and ratio_to_stage0 is the median
// over rounds of (the configuration's mean step time in the round) / (stage 0 with overlap_comm's,
// same round). step_ms and its parts (forward + backward, the step() call, and inside step() what
// the engine reports: reduction wait, update, post-update gather) are medians over all timed steps.
// hidden_fraction = 1 - wait_on / wait_off, where wait is the time step() spends waiting for
// reductions still running when backward ended (the part not hidden): with overlap off every
// reduction starts at the end of backward, so wait_off is the whole reduction time.
//
// ZeRO-3 gathers each unit (a module owning partitioned parameters) before its forward and again
// before its backward, blocking (no prefetch yet), and the engine does not time those gathers.
// gather_all_units_ms is measured from outside: the time to open engine->gathered_parameters() on
// every unit, which fetches the units one after another, each waiting for its all-gather, as a
// forward does; est_gather_fraction = 2 x that / step_ms (two gathers of every unit per step, the
// persistent parameters' post-update gather not included: it is gather_ms).
//
// Memory (every rank prints one "zero_memory" line per stage, measured before the timed engines
// exist, one stage at a time): every tensor allocation of the process goes through a counting
// allocator (c10::SetCPUAllocator), relative to what was live before the stage's model was built:
//   live_mb       between steps: the model's parameters and everything the engine keeps
//   peak_fwd_bwd_mb / peak_step_mb  the highest live bytes during forward + backward (parameters,
//                 gathered units, activations, gradients, staging) / during step()
//   peak_init_mb  during initialize() (stage 3 starts from the full model the caller built)
// and Engine::memory() between steps (parameters_mb: the engine's weight buffers, at stage 3 the
// partition and the persistent parameters, plus gathered units: none between steps).
#include <CLI/CLI.hpp>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/nn/tiny_gpt.h"
#include "transport/launch_env.h"

namespace {

// ---- a counting CPU allocator ---------------------------------------------------------------

std::atomic<int64_t> g_live{0}, g_peak{0};

void count_alloc(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// Wraps LibTorch's default CPU allocator: every DataPtr it hands out carries a context that
// remembers the size and the inner DataPtr, freed (and uncounted) with it. Storages remember
// their allocator, so ZeRO-3's re-materialised units go through it too.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* inner) : inner_(inner) {}
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif

 private:
  struct Context {
    c10::DataPtr inner;
    int64_t bytes;
  };
  static void release(void* ctx) {
    auto* c = static_cast<Context*>(ctx);
    g_live.fetch_sub(c->bytes);
    delete c;  // frees the inner DataPtr
  }
  c10::DataPtr wrap(size_t n) const {
    auto inner = inner_->allocate(n);
    void* data = inner.get();
    const auto device = inner.device();
    auto* ctx = new Context{std::move(inner), int64_t(n)};
    count_alloc(int64_t(n));
    return c10::DataPtr(data, ctx, &CountingAllocator::release, device);
  }
  c10::Allocator* inner_;
};

void reset_peak() { g_peak.store(g_live.load()); }

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

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct Run {
  int stage = 0;
  bool overlap = true;
  std::shared_ptr<tessera::nn::TinyGpt> model;
  std::shared_ptr<tessera::Engine> engine;
  double gradient_mb = 0;  // Engine::memory().gradients after a backward (untimed)
  std::vector<double> step_s, fwd_bwd_s, step_call_s, wait_s, update_s, gather_s;  // per timed step
  std::vector<double> round_s;                                                     // mean step per round
};

}  // namespace

int main(int argc, char** argv) {
  static CountingAllocator counting(c10::GetDefaultCPUAllocator());
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
  auto make_engine = [&](int stage, bool overlap, tessera::nn::TinyGpt& model) {
    std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(micro) +
                       "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-3\n"
                       "[zero_optimization]\nstage = " + std::to_string(stage) +
                       "\noverlap_comm = " + (overlap ? "true" : "false") +
                       "\nreduce_bucket_size = " + std::to_string(model_config.d_model * model_config.d_model) + "\n";
    if (stage == 3) toml += "stage3_param_persistence_threshold = " + std::to_string(threshold) + "\n";
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
      {
        reset_peak();
        auto model = std::make_shared<tessera::nn::TinyGpt>(model_config);
        auto engine = make_engine(stage, true, *model);
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
      }
      std::printf("{\"bench\":\"zero_memory\",\"stage\":%d,\"rank\":%d,\"world\":%d,\"parameters\":%lld,"
                  "\"micro_batch\":%d,\"persistence_threshold\":%lld,\"live_mb\":%.2f,\"peak_fwd_bwd_mb\":%.2f,"
                  "\"peak_step_mb\":%.2f,\"peak_init_mb\":%.2f,\"engine_parameters_mb\":%.2f,"
                  "\"engine_gradients_mb\":%.2f,\"engine_master_mb\":%.2f,\"engine_states_mb\":%.2f,"
                  "\"fp32_model_mb\":%.2f}\n",
                  stage, rank, world, static_cast<long long>(parameters), micro,
                  static_cast<long long>(stage == 3 ? threshold : -1), live * mb, fwd_bwd_peak * mb, step_peak * mb,
                  init_peak * mb, double(em.parameters) * mb, double(em.gradients) * mb, double(em.master) * mb,
                  double(em.optimizer_states) * mb, double(parameters) * 4 * mb);
      std::fflush(stdout);
    }
  }
  if (skip_time) return 0;

  // ---- time, interleaved ----
  std::vector<Run> runs;
  for (int stage : stages)
    for (bool overlap : {false, true}) {
      Run r;
      r.stage = stage, r.overlap = overlap;
      r.model = std::make_shared<tessera::nn::TinyGpt>(model_config);
      r.engine = make_engine(stage, overlap, *r.model);
      runs.push_back(std::move(r));
    }
  size_t baseline = 0;
  for (size_t i = 0; i < runs.size(); ++i)
    if (runs[i].stage == 0 && runs[i].overlap) baseline = i;
  for (auto& r : runs)
    for (int s = 0; s < warmup; ++s) {
      forward_backward(*r.engine, *r.model, s);
      if (s + 1 == warmup) r.gradient_mb = double(r.engine->memory().gradients) / 1e6;
      r.engine->step();
    }
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < runs.size(); ++j) {
      auto& r = runs[(j + size_t(round)) % runs.size()];
      double total = 0;
      for (int k = 0; k < steps; ++k) {
        const auto t0 = std::chrono::steady_clock::now();
        forward_backward(*r.engine, *r.model, warmup + round * steps + k);
        const double fb = seconds_since(t0);
        const auto t1 = std::chrono::steady_clock::now();
        r.engine->step();
        const double st = seconds_since(t1);
        const auto timing = r.engine->last_step_timing();
        r.step_s.push_back(fb + st), r.fwd_bwd_s.push_back(fb), r.step_call_s.push_back(st);
        r.wait_s.push_back(timing.reduction_wait_s), r.update_s.push_back(timing.update_s),
            r.gather_s.push_back(timing.gather_s);
        total += fb + st;
      }
      r.round_s.push_back(total / steps);
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
    std::vector<double> ratios;
    for (int round = 0; round < rounds; ++round) ratios.push_back(r.round_s[size_t(round)] / runs[baseline].round_s[size_t(round)]);
    const Run* off = nullptr;
    for (const auto& o : runs)
      if (o.stage == r.stage && !o.overlap) off = &o;
    std::string extra;
    if (r.overlap && off) {
      const double w_off = median(off->wait_s), w_on = median(r.wait_s);
      extra += ",\"hidden_fraction\":" + std::to_string(w_off > 0 ? std::max(0.0, 1.0 - w_on / w_off) : 0.0);
    }
    if (r.stage == 3) {
      char buf[160];
      std::snprintf(buf, sizeof buf, ",\"persistence_threshold\":%lld,\"gather_all_units_ms\":%.2f,\"est_gather_fraction\":%.3f",
                    static_cast<long long>(threshold), 1e3 * gather_all_s[i], 2 * gather_all_s[i] / median(r.step_s));
      extra += buf;
    }
    std::printf("{\"bench\":\"zero_step\",\"stage\":%d,\"overlap_comm\":%s,\"world\":%d,\"parameters\":%lld,"
                "\"d_model\":%lld,\"layers\":%lld,\"micro_batch\":%d,\"context\":%lld,\"rounds\":%d,\"steps_per_round\":%d,"
                "\"step_ms\":%.2f,\"ratio_to_stage0\":%.3f,\"min_ratio\":%.3f,\"max_ratio\":%.3f,"
                "\"fwd_bwd_ms\":%.2f,\"step_call_ms\":%.2f,\"reduction_wait_ms\":%.2f,\"update_ms\":%.2f,"
                "\"gather_ms\":%.2f,\"gradient_mb\":%.2f%s}\n",
                r.stage, r.overlap ? "true" : "false", world, static_cast<long long>(parameters),
                static_cast<long long>(model_config.d_model), static_cast<long long>(model_config.n_layer), micro,
                static_cast<long long>(model_config.context), rounds, steps, 1e3 * median(r.step_s), median(ratios),
                *std::min_element(ratios.begin(), ratios.end()), *std::max_element(ratios.begin(), ratios.end()),
                1e3 * median(r.fwd_bwd_s), 1e3 * median(r.step_call_s), 1e3 * median(r.wait_s),
                1e3 * median(r.update_s), 1e3 * median(r.gather_s), r.gradient_mb, extra.c_str());
  }
  std::fflush(stdout);
  return 0;
}
