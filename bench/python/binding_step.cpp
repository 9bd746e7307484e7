// binding_step: the C++ side of bench/python/binding_overhead.py. One rank's training step (forward,
// backward, step) of an MLP through the C++ engine, timed over --steps after --warmup, on data made
// before the clock starts. The Python side runs the same model, config and data through the binding.
// --save FILE: rank 0 writes the trained weights (whole, at every stage) as safetensors, for
// tests/python/cpp_parity.py.
//   tools/tessera-launch --nproc-per-node 2 build/bench/python/binding_step --stage 2
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "actors/engine/engine.h"
#include "bench/common/median.h"
#include "core/config/load.h"
#include "core/io/safetensors.h"
#include "transport/launch_env.h"

int main(int argc, char** argv) {
  CLI::App app{"C++ engine step time (the baseline of the Python binding's overhead)"};
  int width = 256, layers = 4, steps = 200, warmup = 10, stage = 2, batch = 16;
  app.add_option("--width", width);
  app.add_option("--layers", layers);
  app.add_option("--steps", steps);
  app.add_option("--warmup", warmup);
  app.add_option("--stage", stage);
  app.add_option("--batch", batch);
  std::string save;
  app.add_option("--save", save, "rank 0 writes the trained weights here (safetensors)");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  torch::manual_seed(1234);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) model->push_back(torch::nn::ReLU());
  }
  const std::string config = "{\"train_micro_batch_size_per_gpu\": " + std::to_string(batch) +
                             ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001, \"weight_decay\": 0.01}}, "
                             "\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
  auto engine = tessera::initialize(model.ptr(), tessera::config::load_config_text(config, tessera::config::Format::json, "bench")).engine;
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < warmup + steps; ++s) {
    auto g = at::detail::createCPUGenerator(10000 * s + env.rank);
    xs.push_back(torch::randn({batch, width}, g));
    ys.push_back(torch::randn({batch, width}, g));
  }
  using clock = std::chrono::steady_clock;
  clock::time_point start;
  double phase_ms[3] = {0, 0, 0};  // forward (with the loss), backward, step
  std::vector<double> step_ms;     // each timed step: their median is not moved by a scheduler hiccup
  for (int s = 0; s < warmup + steps; ++s) {
    const auto t0 = clock::now();
    if (s == warmup) start = t0;
    // Through the engine's forward, as the Python side's engine(x) and DeepSpeed's users go (at ZeRO-3 it is
    // the prefetch window).
    auto loss = torch::mse_loss(engine->forward([&] { return model->forward(xs[size_t(s)]); }), ys[size_t(s)]);
    const auto t1 = clock::now();
    engine->backward(loss);
    const auto t2 = clock::now();
    engine->step();
    if (s < warmup) continue;
    const clock::time_point edges[4] = {t0, t1, t2, clock::now()};
    for (int i = 0; i < 3; ++i) phase_ms[i] += std::chrono::duration<double, std::milli>(edges[i + 1] - edges[i]).count();
    step_ms.push_back(std::chrono::duration<double, std::milli>(edges[3] - edges[0]).count());
  }
  const double ms = std::chrono::duration<double, std::milli>(clock::now() - start).count() / steps;
  std::printf("{\"impl\": \"cpp\", \"rank\": %d, \"world\": %d, \"stage\": %d, \"ms_per_step\": %.4f, \"median_step_ms\": %.4f, "
              "\"forward_ms\": %.4f, "
              "\"backward_ms\": %.4f, \"step_ms\": %.4f}\n",
              env.rank, env.world_size, stage, ms, tessera::bench::median(step_ms), phase_ms[0] / steps, phase_ms[1] / steps, phase_ms[2] / steps);
  if (!save.empty()) {
    auto whole = engine->gathered_parameters();  // ZeRO-3: every rank takes part; a no-op at stages 0-2
    std::vector<std::pair<std::string, at::Tensor>> weights;
    for (const auto& item : model->named_parameters()) weights.emplace_back(item.key(), item.value().detach().clone());
    whole.close();
    if (env.rank == 0) tessera::io::write_safetensors(save, weights);
  }
  return 0;
}
