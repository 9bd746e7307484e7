// dp_step: step time of tessera's data-parallel path against a plain LibTorch data-parallel loop,
// measured in the same run, interleaved.
//   tools/tessera-launch --nproc-per-node 2 build/bench/zero_step/dp_step [--rounds 15]
//
// The baseline is what one writes with LibTorch alone: c10d's Gloo process group, an all-reduce
// of each gradient issued as soon as autograd finishes it (overlapped with the rest of backward),
// then division by the world size and torch::optim::AdamW. tessera runs the same model, data and
// optimizer at stages 0, 1 and 2. Every round runs each configuration for --steps steps (the order
// rotates from round to round); the results are the medians over rounds of the per-round ratios
// (stage 0 / baseline, stage 1 and 2 / stage 0), with wall time and CPU time (all threads of the
// process, getrusage) per step beside each other. Rank 0 prints JSON lines.
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <thread>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "bench/common/median.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/nn/mlp.h"
#include "core/nn/tiny_gpt.h"
#include "core/zero/grad_ready_hooks.h"
#include "transport/detail/c10d_store.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

using tessera::bench::median;

// The model under test: the MLP, or TinyGpt on the byte corpus (--model gpt).
struct Model {
  std::shared_ptr<tessera::nn::Mlp> mlp;
  std::shared_ptr<tessera::nn::TinyGpt> gpt;
  const tessera::data::ByteCorpus* corpus = nullptr;
  int batch = 0, world = 1;
  std::shared_ptr<torch::nn::Module> module() const { return mlp ? mlp->module() : gpt->module(); }
  at::Tensor loss(int64_t k, int rank) const {
    if (mlp) return mlp->loss(batch, 11, k, rank);
    auto b = corpus->batch(1, k, 0, batch * world, gpt->config().context, rank, world);
    return gpt->loss(b.tokens, b.targets);
  }
};

// One way of training: step(k) runs optimizer step k (forward, backward, update).
struct Runner {
  std::string name;
  std::function<void(int64_t)> step;
  std::vector<double> wall_ms, cpu_ms;  // per round, per step
};

// The plain LibTorch loop.
struct PlainLoop {
  PlainLoop(Model m, int rank, int world, double lr) : model(std::move(m)), rank(rank), world(world) {
    auto store = tessera::actors::job_store();
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(120));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    opts->threads = 2;
    pg = c10::make_intrusive<c10d::ProcessGroupGloo>(tessera::transport::c10d_store(*store, "plain_dp"), rank, world, opts);
    params = model.module()->parameters();
    optimizer = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(lr));
    for (auto& p : params) p.mutable_grad() = torch::zeros_like(p);
    hooks = std::make_unique<tessera::zero::GradReadyHooks>(
        params,
        [this](int64_t i) {
          std::vector<at::Tensor> t{params[size_t(i)].grad()};
          works.push_back(pg->allreduce(t));
        },
        [] {});
  }
  void step(int64_t k) {
    works.clear();
    model.loss(k, rank).backward();
    for (auto& w : works) w->wait();
    for (auto& p : params) p.mutable_grad().div_(world);
    optimizer->step();
    for (auto& p : params) p.mutable_grad().zero_();
  }
  Model model;
  int rank, world;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<tessera::zero::GradReadyHooks> hooks;
  std::vector<c10::intrusive_ptr<c10d::Work>> works;  // autograd's thread appends, the caller waits after backward
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Data-parallel step time: tessera stages 0/1/2 against a plain LibTorch loop"};
  tessera::nn::MlpConfig model;
  int rounds = 15, steps = 3, warmup = 3, batch = 64;
  int64_t bucket = 25'000'000 / 4;  // 25 MB of fp32, torch DDP's bucket size
  app.add_option("--rounds", rounds, "interleaved rounds (pairs)");
  app.add_option("--steps", steps, "steps per configuration and round");
  app.add_option("--batch", batch, "rows per rank and step");
  app.add_option("--width", model.width, "MLP width");
  app.add_option("--layers", model.layers, "MLP hidden layers");
  app.add_option("--bucket", bucket, "tessera's reduce_bucket_size (elements)");
  std::string model_kind = "mlp";
  app.add_option("--model", model_kind, "mlp (256-width x layers-16) or gpt (train_lm's TinyGpt, batch sequences of 64)")
      ->check(CLI::IsMember({"mlp", "gpt"}));
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  at::set_num_threads(std::max(1, int(std::thread::hardware_concurrency()) / std::max(1, env.world_size)));
  const double lr = 1e-4;
  tessera::data::ByteCorpus corpus(tessera::data::ByteCorpus::default_paths());
  tessera::nn::GptConfig gpt;
  gpt.d_model = 128, gpt.n_layer = 4, gpt.n_head = 4, gpt.context = 64;
  auto make_model = [&] {
    Model m;
    m.batch = batch, m.world = env.world_size, m.corpus = &corpus;
    if (model_kind == "mlp") m.mlp = std::make_shared<tessera::nn::Mlp>(model);
    else m.gpt = std::make_shared<tessera::nn::TinyGpt>(gpt);
    return m;
  };
  int64_t parameters = 0;
  {
    auto probe = make_model();
    for (const auto& p : probe.module()->parameters()) parameters += p.numel();
  }

  std::vector<Runner> runners;
  PlainLoop plain(make_model(), env.rank, env.world_size, lr);
  runners.push_back({"plain_libtorch", [&](int64_t k) { plain.step(k); }, {}, {}});
  std::vector<std::shared_ptr<tessera::Engine>> engines;
  for (int stage : {0, 1, 2}) {
    auto m = make_model();
    const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(batch) +
                             "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = " + std::to_string(lr) +
                             "\nweight_decay = 0.01\n[zero_optimization]\nstage = " + std::to_string(stage) +
                             "\noverlap_comm = true\nreduce_bucket_size = " + std::to_string(bucket) + "\n";
    auto engine = tessera::initialize(m.module(), tessera::config::load_config_text(toml, tessera::config::Format::toml, "dp_step")).engine;
    engines.push_back(engine);
    runners.push_back({"stage" + std::to_string(stage), [engine, m, rank = env.rank](int64_t k) {
                         engine->backward(m.loss(k, rank));
                         engine->step();
                       }, {}, {}});
  }
  for (auto& r : runners)
    for (int k = 0; k < warmup; ++k) r.step(k);
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < runners.size(); ++j) {
      auto& r = runners[(j + size_t(round)) % runners.size()];
      const double c0 = cpu_seconds();
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < steps; ++k) r.step(warmup + round * steps + k);
      const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.wall_ms.push_back(1e3 * wall / steps);
      r.cpu_ms.push_back(1e3 * (cpu_seconds() - c0) / steps);
    }
  }
  if (env.rank != 0) return 0;
  auto ratios = [&](size_t a, size_t b) {
    std::vector<double> wall, cpu;
    for (int i = 0; i < rounds; ++i) {
      wall.push_back(runners[a].wall_ms[size_t(i)] / runners[b].wall_ms[size_t(i)]);
      cpu.push_back(runners[a].cpu_ms[size_t(i)] / runners[b].cpu_ms[size_t(i)]);
    }
    return std::make_pair(median(wall), median(cpu));
  };
  for (size_t i = 0; i < runners.size(); ++i) {
    const size_t baseline = i == 1 ? 0 : (i == 0 ? 0 : 1);  // stage 0 against the plain loop; 1, 2 against stage 0
    const auto [wall_ratio, cpu_ratio] = ratios(i, baseline);
    std::printf("{\"bench\":\"dp_step\",\"model\":\"%s\",\"config\":\"%s\",\"baseline\":\"%s\",\"world\":%d,\"parameters\":%lld,"
                "\"batch\":%d,\"rounds\":%d,\"steps_per_round\":%d,\"bucket_elements\":%lld,"
                "\"median_wall_ms\":%.2f,\"min_wall_ms\":%.2f,\"median_cpu_ms\":%.2f,"
                "\"median_wall_ratio\":%.3f,\"median_cpu_ratio\":%.3f}\n",
                model_kind.c_str(), runners[i].name.c_str(), runners[baseline].name.c_str(), env.world_size,
                static_cast<long long>(parameters), batch, rounds, steps,
                static_cast<long long>(bucket), median(runners[i].wall_ms),
                *std::min_element(runners[i].wall_ms.begin(), runners[i].wall_ms.end()), median(runners[i].cpu_ms),
                wall_ratio, cpu_ratio);
  }
  return 0;
}
