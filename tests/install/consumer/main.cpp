// Uses the installed headers and libraries of tessera as another project would: the error
// hierarchy, a configuration loaded from TOML text, an affine plan, and the engine
// (<tessera/actors/engine/engine.h>, initialize, Engine::rank, gathered_parameters) training a
// step of a small module, compared bitwise with LibTorch's own AdamW on a copy of it. Prints
// "consumer ok <version>" on success.
#include <tessera/actors/engine/engine.h>
#include <tessera/core/affine/builders.h>
#include <tessera/core/affine/planner.h>
#include <tessera/core/config/load.h>
#include <tessera/core/error.h>
#include <tessera/core/version.h>
#include <torch/torch.h>

#include <iostream>

namespace {

// One step of the engine (one rank, ZeRO-2) against torch::optim::AdamW on the same values.
int engine_step() {
  torch::manual_seed(3);
  auto model = torch::nn::Linear(8, 4), oracle = torch::nn::Linear(8, 4);
  {
    torch::NoGradGuard no_grad;
    oracle->weight.copy_(model->weight), oracle->bias.copy_(model->bias);
  }
  const auto x = torch::randn({16, 8}), y = torch::randn({16, 4});
  auto config = tessera::config::load_config_text(
      "train_micro_batch_size_per_gpu = 16\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-2\n"
      "weight_decay = 0.01\n[zero_optimization]\nstage = 2\n",
      tessera::config::Format::toml, "consumer.toml");
  auto engine = tessera::initialize(model.ptr(), config).engine;
  if (engine->rank() != 0) return 10;
  engine->backward(torch::mse_loss(model(x), y));
  engine->step();
  torch::optim::AdamW adamw(oracle->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  torch::mse_loss(oracle(x), y).backward();
  adamw.step();
  auto scope = engine->gathered_parameters();
  if (torch::equal(model->weight, oracle->weight) && torch::equal(model->bias, oracle->bias)) return 0;
  return 11;
}

}  // namespace

int main() {
  try {
    tessera::config::load_config_text("[zero_optimization]\nstagee = 2\n", tessera::config::Format::toml, "c.toml");
    return 1;  // a typo must be refused
  } catch (const tessera::ConfigError& e) {
    if (std::string(e.what()).find("stage") == std::string::npos) return 2;
  }
  auto config = tessera::config::load_config_text("[zero_optimization]\nstage = 2\n", tessera::config::Format::toml,
                                                  "c.toml");
  if (config.zero_optimization.stage.value != 2) return 3;
  tessera::affine::TensorInfo w{"w", tessera::affine::DType::f32, tessera::affine::Dims{8, 6}};
  auto rows = tessera::affine::contiguous_split(w, 0, {4, 4});
  auto cols = tessera::affine::contiguous_split(w, 1, {2, 2, 2});
  auto plan = tessera::affine::plan(cols, rows);
  if (plan.segments.empty()) return 4;
  if (int status = engine_step()) {
    std::cerr << "consumer: the engine's step differs from LibTorch's AdamW (status " << status << ")\n";
    return status;
  }
  std::cout << "consumer ok " << TESSERA_VERSION_STRING << " (" << plan.segments.size()
            << " segments; an engine step equal to LibTorch's AdamW)\n";
  return 0;
}
