// binding_step: the C++ side of bench/python/binding_overhead.py. One rank's training step (forward,
// backward, step) of an MLP through the C++ engine, timed over --steps after --warmup, on data made
// before the clock starts. The Python side runs the same model, config and data through the binding.
//   tools/tessera-launch --nproc-per-node 2 build/bench/python/binding_step --stage 2
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "actors/engine/engine.h"
#include "core/config/load.h"
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
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  torch::manual_seed(1234);
  torch::nn::Sequential model;
  for (int i = 0; i < layers; ++i) {
    model->push_back(torch::nn::Linear(width, width));
    if (i + 1 < layers) model->push_back(torch::nn::ReLU());
  }
  const std::string config = "{\"train_micro_batch_size_per_gpu\": " + std::to_string(batch) +
                             ", \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 0.001}}, "
                             "\"zero_optimization\": {\"stage\": " + std::to_string(stage) + "}}";
  auto engine = tessera::initialize(model.ptr(), tessera::config::load_config_text(config, tessera::config::Format::json, "bench")).engine;
  std::vector<torch::Tensor> xs, ys;
  for (int s = 0; s < warmup + steps; ++s) {
    auto g = at::detail::createCPUGenerator(10000 * s + env.rank);
    xs.push_back(torch::randn({batch, width}, g));
    ys.push_back(torch::randn({batch, width}, g));
  }
  std::chrono::steady_clock::time_point start;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) start = std::chrono::steady_clock::now();
    auto loss = torch::mse_loss(model->forward(xs[size_t(s)]), ys[size_t(s)]);
    engine->backward(loss);
    engine->step();
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / steps;
  std::printf("{\"impl\": \"cpp\", \"rank\": %d, \"world\": %d, \"stage\": %d, \"ms_per_step\": %.4f}\n", env.rank,
              env.world_size, stage, ms);
  return 0;
}
