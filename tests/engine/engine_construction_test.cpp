// Partitioned construction (core/zero/partitioned_construction.h, DeepSpeed's zero.Init): a model
// built inside the scope keeps 1/W of each held module's parameters from the moment the module
// exists; a stage-3 initialize builds its units from the ranks' chunks. Oracle: the same model
// built plainly from the same seed: bitwise the same weights after initialize and after training.
// TinyGpt and the Llama/Qwen decoders, whose init loops run after construction, write their cut
// parameters through write_constructed().
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/zero/partitioned_construction.h"
#include "core/nn/decoder.h"
#include "core/nn/tiny_gpt.h"
#include "core/zero/unit_holder.h"
#include "tests/engine/engine_test_support.h"
#include "tests/nn/decoder_models.h"

namespace {

using namespace tessera::engine_testing;

// Values made in the constructors (LibTorch's own initialisation), as partitioned construction needs.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    emb = register_module("emb", torch::nn::Embedding(256, 32));
    fc = register_module("fc", torch::nn::Linear(32, 64));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({64})));
    head = register_module("head", torch::nn::Linear(64, 256));
  }
  torch::Tensor loss(const torch::Tensor& tokens) {
    auto logits = head(norm(torch::gelu(fc(emb(tokens)))));
    return torch::nn::functional::cross_entropy(logits.view({-1, 256}), tokens.roll(-1, 1).reshape({-1}));
  }
  tessera::Unit<torch::nn::Embedding> emb{nullptr};
  tessera::Unit<torch::nn::Linear> fc{nullptr}, head{nullptr};
  torch::nn::LayerNorm norm{nullptr};  // not held: never cut (and persistent under the threshold)
};

std::shared_ptr<NetImpl> build(bool partitioned) {
  torch::manual_seed(5);
  if (!partitioned) return std::make_shared<NetImpl>();
  tessera::zero::PartitionedConstruction scope;
  return std::make_shared<NetImpl>();
}

std::string toml(int stage) {
  return "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\n"
         "weight_decay = 0.01\n[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nstage3_param_persistence_threshold = 100\n[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

std::pair<std::map<std::string, torch::Tensor>, std::map<std::string, torch::Tensor>> run(bool partitioned) {
  auto net = build(partitioned);
  auto engine =
      tessera::initialize(net, tessera::config::load_config_text(toml(3), tessera::config::Format::toml, "construction")).engine;
  std::map<std::string, torch::Tensor> initial;
  {
    auto g = engine->gathered_parameters();
    initial = snapshot_parameters(*net);
  }
  for (int step = 0; step < 3; ++step) {
    auto gen = at::detail::createCPUGenerator(uint64_t(10 * step + kRank));
    engine->backward(net->loss(torch::randint(0, 256, {4, 12}, gen, torch::kLong)));
    engine->step();
  }
  auto g = engine->gathered_parameters();
  return {initial, snapshot_parameters(*net)};
}

}  // namespace

TEST_CASE("Inside the scope each held module keeps this rank's chunk only", "[construction]") {
  auto net = build(true);
  for (const auto& item : net->named_parameters()) {
    INFO(item.key());
    const bool held = item.key().rfind("norm.", 0) != 0;
    const auto chunk = tessera::zero::constructed_chunk(item.value());
    CHECK(chunk.has_value() == held);
    if (!held) continue;
    CHECK(item.value().storage().nbytes() == 0);  // the whole is gone
    CHECK(chunk->numel == item.value().numel());
    CHECK(chunk->chunk.numel() == (item.value().numel() + kWorld - 1) / kWorld);
    CHECK(chunk->world == kWorld);
    CHECK(chunk->rank == kRank);
  }
  CHECK_THROWS_WITH(
      tessera::initialize(net, tessera::config::load_config_text(toml(2), tessera::config::Format::toml, "construction")),
      Catch::Contains("partitioned construction") && Catch::Contains("stage 3"));
}

TEST_CASE("Partitioned construction gives the weights of plain construction, bitwise, before and after training",
          "[construction]") {
  const auto [plain_initial, plain_trained] = run(false);
  const auto [cut_initial, cut_trained] = run(true);
  INFO("after initialize");
  expect_same_parameters(cut_initial, plain_initial);
  INFO("after 3 AdamW steps");
  expect_same_parameters(cut_trained, plain_trained);
}

TEST_CASE("TinyGpt and the Llama/Qwen2/Qwen3 decoders built in the scope have plain construction's weights",
          "[construction]") {
  auto initial_weights = [](const std::function<std::shared_ptr<torch::nn::Module>()>& make, bool partitioned,
                            bool expect_cut) {
    std::shared_ptr<torch::nn::Module> model;
    if (partitioned) {
      tessera::zero::PartitionedConstruction scope;
      model = make();
    } else {
      model = make();
    }
    int64_t cut = 0;
    for (const auto& p : model->parameters()) cut += tessera::zero::constructed_chunk(p).has_value();
    CHECK((cut > 0) == expect_cut);
    auto engine =
        tessera::initialize(model, tessera::config::load_config_text(toml(3), tessera::config::Format::toml, "construction"))
            .engine;
    auto g = engine->gathered_parameters();
    return snapshot_parameters(*model);
  };
  std::vector<std::pair<std::string, std::function<std::shared_ptr<torch::nn::Module>()>>> models;
  models.emplace_back("tiny_gpt", [] { return tessera::nn::TinyGpt(small_gpt_config(12)).module(); });
  for (const std::string family : {"llama", "qwen2", "qwen3"})
    models.emplace_back(family, [family] {
      auto config = tessera::nn::testing::family_config(family);
      config.vocab_size = 256;
      tessera::nn::DecoderOptions o;
      o.seed = 9;
      return tessera::nn::DecoderLm(config, o).module();
    });
  for (const auto& [name, make] : models) {
    INFO(name);
    expect_same_parameters(initial_weights(make, true, true), initial_weights(make, false, false));
  }
  // A bf16 decoder cannot be cut (its conversion would read the freed weights): refused by name.
  tessera::zero::PartitionedConstruction scope;
  tessera::nn::DecoderOptions bf16;
  bf16.dtype = torch::kBFloat16;
  CHECK_THROWS_WITH(tessera::nn::DecoderLm(tessera::nn::testing::family_config("qwen3"), bf16),
                    Catch::Contains("partitioned construction builds fp32 weights"));
}
