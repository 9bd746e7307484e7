// Tied weights: one tensor registered by two modules (an LM head sharing the embedding's weight)
// is one parameter to the engine (under its first name, as Python's parameters() gives it once);
// at ZeRO-3 it stays gathered (persistent), since either module may use it first. Oracle: a
// single-process LibTorch AdamW on the deduplicated parameters with every rank's gradients
// averaged: bitwise at 2 ranks at stages 0, 2 and 3, relative L2 <= 1e-5 at 4.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <set>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/zero/unit_holder.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

constexpr int64_t kVocab = 64, kWidth = 16;

// A head whose weight is another module's tensor.
struct TiedHeadImpl : torch::nn::Module {
  explicit TiedHeadImpl(const torch::Tensor& shared) { weight = register_parameter("weight", shared); }
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(TiedHead);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    torch::manual_seed(23);
    emb = register_module("emb", torch::nn::Embedding(kVocab, kWidth));
    fc = register_module("fc", torch::nn::Linear(kWidth, kWidth));
    head = register_module("head", TiedHead(emb->weight));
  }
  torch::Tensor loss(const torch::Tensor& tokens) {
    auto logits = head(torch::tanh(fc(emb(tokens))));
    return torch::nn::functional::cross_entropy(logits.view({-1, kVocab}), tokens.roll(-1, 1).reshape({-1}));
  }
  tessera::Unit<torch::nn::Embedding> emb{nullptr};
  tessera::Unit<torch::nn::Linear> fc{nullptr};
  tessera::Unit<TiedHead> head{nullptr};
};

torch::Tensor tokens(int rank, int step) {
  auto g = at::detail::createCPUGenerator(uint64_t(31 * step + rank));
  return torch::randint(0, kVocab, {4, 8}, g, torch::kLong);
}

std::vector<torch::Tensor> unique_parameters(torch::nn::Module& m) {
  std::vector<torch::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (auto& p : m.parameters())
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

constexpr int kSteps = 6;

std::map<std::string, torch::Tensor> oracle() {
  auto net = std::make_shared<NetImpl>();
  auto params = unique_parameters(*net);
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
  for (int step = 0; step < kSteps; ++step) {
    average_rank_gradients(params, [&](int rank) { return net->loss(tokens(rank, step)); });
    adamw.step();
  }
  return snapshot_parameters(*net);
}

}  // namespace

TEST_CASE("Tied weights train as the single-process oracle at stages 0, 2 and 3", "[tied]") {
  const auto expected = oracle();
  for (int stage : {0, 2, 3}) {
    INFO("stage " << stage);
    auto net = std::make_shared<NetImpl>();
    const std::string toml = "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\n"
                             "lr = 1e-2\nweight_decay = 0.01\n[zero_optimization]\nstage = " + std::to_string(stage) +
                             "\nstage3_param_persistence_threshold = 0\n[tessera.transport]\ncollective_timeout_ms = 60000\n";
    auto engine = tessera::initialize(net, tessera::config::load_config_text(toml, tessera::config::Format::toml, "tied")).engine;
    for (int step = 0; step < kSteps; ++step) {
      engine->backward(net->loss(tokens(kRank, step)));
      engine->step();
      CHECK(net->head->weight.is_same(net->emb->weight));  // still one tensor
    }
    if (stage == 3) {
      // The tied weight is persistent (threshold 0 partitions everything else).
      CHECK(net->emb->weight.storage().nbytes() > 0);
      CHECK(net->fc->weight.storage().nbytes() == 0);
    }
    std::map<std::string, torch::Tensor> got;
    {
      auto gathered = engine->gathered_parameters();
      got = snapshot_parameters(*net);
    }
    expect_same_parameters(got, expected);
  }
}
