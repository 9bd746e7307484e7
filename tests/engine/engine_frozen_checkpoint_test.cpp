// Frozen parameters (requires_grad false) in checkpoints, as DeepSpeed keeps them in its module
// states: saved whole and restored by load_checkpoint at stages 0-3, against the values the saving
// engine's model holds (the load's targets NaN-filled first, so every byte must be overwritten;
// the trainable weights are compared through gathered parameters too). A model whose frozen
// parameters are not the checkpoint's (one more, one fewer, another shape) is refused on every rank
// naming the parameter, before anything changes.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "tests/engine/engine_test_support.h"

namespace fs = std::filesystem;

namespace {

using namespace tessera::engine_testing;

// Linear(6, 8) with its weight frozen, ReLU, Linear(8, 2); `extra`: one more frozen parameter.
torch::nn::Sequential make_model(uint64_t seed, bool extra = false, int64_t extra_size = 3) {
  torch::manual_seed(seed);
  torch::nn::Sequential model(torch::nn::Linear(6, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
  model[0]->named_parameters()["weight"].set_requires_grad(false);
  if (extra) model->register_parameter("extra", torch::randn({extra_size}), /*requires_grad=*/false);
  return model;
}

std::string config_toml(int stage) {
  return "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-2\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) + "\nstage3_param_persistence_threshold = 0\n"
         "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

std::shared_ptr<tessera::Engine> engine_of(torch::nn::Sequential& model, int stage) {
  return tessera::initialize(model.ptr(), tessera::config::load_config_text(config_toml(stage), tessera::config::Format::toml,
                                                                            "frozen_checkpoint"))
      .engine;
}

void train(tessera::Engine& engine, torch::nn::Sequential& model, int steps) {
  for (int step = 0; step < steps; ++step) {
    auto g = at::detail::createCPUGenerator(uint64_t(100 * step + kRank));
    engine.backward(model->forward(torch::randn({4, 6}, g)).pow(2).mean());
    engine.step();
  }
}

std::string root() {
  const char* job = std::getenv("TESSERA_JOB");
  return (fs::temp_directory_path() / ("tessera_frozen_ckpt_" + std::string(job ? job : "solo"))).string();
}

std::map<std::string, torch::Tensor> gathered(tessera::Engine& engine, torch::nn::Sequential& model) {
  std::map<std::string, torch::Tensor> out;
  auto scope = engine.gathered_parameters();
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

}  // namespace

TEST_CASE("Frozen parameters are saved whole and restored by a load at stages 0-3", "[frozen]") {
  for (int stage = 0; stage <= 3; ++stage) {
    DYNAMIC_SECTION("stage " << stage) {
      const auto dir = root() + "/stage" + std::to_string(stage);
      auto saved_model = make_model(5, true);
      auto saver = engine_of(saved_model, stage);
      train(*saver, saved_model, 2);
      {  // a frozen parameter changed by the user (frozen means "not trained", not "constant")
        torch::NoGradGuard no_grad;
        saved_model[0]->named_parameters()["weight"].mul_(0.5);
      }
      saver->save_checkpoint(dir, {"t"});
      const auto expected = gathered(*saver, saved_model);

      auto loaded_model = make_model(6, true);  // other values everywhere
      {
        torch::NoGradGuard no_grad;
        loaded_model[0]->named_parameters()["weight"].fill_(NAN);
        loaded_model->named_parameters()["extra"].fill_(NAN);
      }
      auto loader = engine_of(loaded_model, stage);
      loader->load_checkpoint(dir, {"t"});
      const auto got = gathered(*loader, loaded_model);
      REQUIRE(got.size() == expected.size());
      for (const auto& [name, t] : expected) {
        INFO(name);
        CHECK(torch::equal(got.at(name), t));  // NaN != NaN: a frozen byte not overwritten fails here
      }
      CHECK_FALSE(torch::equal(got.at("0.weight"), make_model(5, true)[0]->named_parameters()["weight"]));
      // Both go on training alike.
      train(*saver, saved_model, 1);
      train(*loader, loaded_model, 1);
      const auto a = gathered(*saver, saved_model), b = gathered(*loader, loaded_model);
      for (const auto& [name, t] : a) CHECK(torch::equal(b.at(name), t));
    }
  }
}

TEST_CASE("A model whose frozen parameters are not the checkpoint's is refused naming the parameter", "[frozen]") {
  const auto dir = root() + "/refuse";
  auto with_extra = make_model(5, true);
  auto saver = engine_of(with_extra, 2);
  saver->save_checkpoint(dir, {"extra"});
  auto without = make_model(5, false);
  auto saver2 = engine_of(without, 2);
  saver2->save_checkpoint(dir, {"plain"});

  auto check_refused = [&](torch::nn::Sequential& model, tessera::Engine& engine, const std::string& tag,
                           const std::string& says) {
    const auto before = gathered(engine, model);
    try {
      engine.load_checkpoint(dir, {tag});
      FAIL("loaded " << tag);
    } catch (const tessera::CheckpointError& e) {
      CHECK_THAT(e.what(), Catch::Contains(says));
    }
    const auto after = gathered(engine, model);
    for (const auto& [name, t] : before) CHECK(torch::equal(after.at(name), t));  // nothing changed
  };
  auto lacks = make_model(7, true);
  auto lacks_engine = engine_of(lacks, 2);
  check_refused(lacks, *lacks_engine, "plain", "holds no frozen parameter 'extra'");
  auto fewer = make_model(7, false);
  auto fewer_engine = engine_of(fewer, 2);
  check_refused(fewer, *fewer_engine, "extra", "holds frozen parameter 'extra', which this model does not have");
  auto other_shape = make_model(7, true, 4);
  auto other_engine = engine_of(other_shape, 2);
  check_refused(other_shape, *other_engine, "extra", "frozen parameter 'extra' is f32 (3) there, f32 (4) in this model");
}
