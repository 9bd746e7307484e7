// Engine::storage_maps() against oracles: every rank's buffers are all-gathered, the full weights,
// masters and optimizer states are rebuilt through the affine planner and local executor into
// NaN-filled targets, and compared bitwise with the module's weights and with LibTorch's AdamW
// states from a single-process run. A negative control swaps two ranks' storage in a map.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <map>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/affine/builders.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/test_communicator.h"
#include "transport/communicator.h"

namespace {

using namespace tessera::engine_testing;

// TinyGpt plus a 7-element parameter: the group size is odd, so every world > 1 pads it and
// parameters straddle partitions.
struct Model : torch::nn::Module {
  Model() {
    tessera::nn::GptConfig c;
    c.d_model = 32, c.n_layer = 1, c.n_head = 2, c.context = 16, c.seed = 13;
    gpt = std::make_shared<tessera::nn::TinyGpt>(c);
    register_module("gpt", gpt->module());
    extra = register_parameter("extra", torch::linspace(-1, 1, 7));
  }
  torch::Tensor loss(int step, int rank) {
    auto b = corpus().batch(9, step, 0, 4 * kWorld, 16, rank, kWorld);
    return gpt->loss(b.tokens, b.targets) + extra.pow(2).sum() * 0.01;
  }
  std::shared_ptr<tessera::nn::TinyGpt> gpt;
  torch::Tensor extra;
};

tessera::transport::Communicator& test_world() { return test_communicator("storage_test", std::chrono::seconds(60)); }

// Every rank's buffer, indexed by rank (all ranks' buffers of one kind have one size).
std::vector<torch::Tensor> gather(const torch::Tensor& mine) {
  auto flat = mine.contiguous().view(-1);
  auto all = torch::empty({flat.numel() * kWorld}, flat.options());
  if (kWorld == 1) all.copy_(flat);
  else test_world().all_gather(flat, all)->wait();
  return all.chunk(kWorld);
}

tessera::affine::DType to_affine(torch::ScalarType t) {
  return t == torch::kFloat ? tessera::affine::DType::f32 : tessera::affine::DType::bf16;
}

// The full tensor a map describes, rebuilt from every rank's buffer into a NaN-filled target.
torch::Tensor rebuild(const tessera::affine::TensorMap& map, const std::vector<torch::Tensor>& buffers) {
  tessera::affine::TensorInfo info{map.name, map.dtype, map.shape};
  auto target_map = tessera::affine::replicated(info, 1);
  auto plan = tessera::affine::plan(target_map, map);
  const auto dtype = buffers[0].scalar_type();
  auto full = torch::full(map.shape.to_vector(), std::nan(""), torch::TensorOptions().dtype(dtype));
  tessera::affine::LocalTransfer transfer;
  transfer.plan = &plan;
  for (int r = 0; r < kWorld; ++r)
    transfer.source_buffers[r] = {buffers[r].data_ptr(), buffers[r].numel(), to_affine(dtype)};
  transfer.target_buffers[0] = {full.data_ptr(), full.numel(), to_affine(dtype)};
  tessera::affine::execute_local({transfer});
  return full;
}

std::string config(int stage, const std::string& precision = "") {
  return "train_micro_batch_size_per_gpu = 4\n" + precision +
         "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) + "\nreduce_bucket_size = 3000\n";
}

}  // namespace

TEST_CASE("Storage maps rebuild weights, masters and AdamW states bitwise (fp32)", "[engine][storage]") {
  // Oracle: the single-process run with LibTorch's AdamW (averaged per-rank gradients).
  auto oracle = std::make_shared<Model>();
  auto params = oracle->parameters();
  torch::optim::AdamW opt(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  for (int step = 0; step < 3; ++step) {
    average_rank_gradients(params, [&](int rank) { return oracle->loss(step, rank); });
    opt.step();
  }
  std::map<std::string, std::map<std::string, torch::Tensor>> expected;  // kind -> name -> tensor
  for (auto& item : oracle->named_parameters()) {
    const auto& p = item.value();
    auto& state = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
    expected["param"][item.key()] = p.detach();
    expected["master"][item.key()] = p.detach();
    expected["exp_avg"][item.key()] = state.exp_avg();
    expected["exp_avg_sq"][item.key()] = state.exp_avg_sq();
  }

  for (int stage : {0, 1, 2}) {
    INFO("stage " << stage << " world " << kWorld);
    auto model = std::make_shared<Model>();
    auto engine = tessera::initialize(model, tessera::config::load_config_text(config(stage), tessera::config::Format::toml, "s")).engine;
    for (int step = 0; step < 3; ++step) {
      engine->backward(model->loss(step, kRank));
      engine->step();
    }
    auto storage = engine->storage_maps();
    REQUIRE(storage.maps.size() == 4 * expected["param"].size());
    std::map<std::string, std::vector<torch::Tensor>> gathered;
    for (const auto& [key, buffer] : storage.buffers) gathered[key] = gather(buffer);
    for (const auto& [kind, buffer, map] : storage.maps) {
      INFO(kind << " of " << map.name);
      auto full = rebuild(map, gathered.at(buffer));
      CHECK_FALSE(torch::isnan(full).any().item<bool>());
      if (kWorld <= 2) CHECK(torch::equal(full, expected.at(kind).at(map.name)));
      else CHECK(torch::allclose(full, expected.at(kind).at(map.name), 1e-4, 1e-6));
    }
    // Negative controls on a partitioned map (docs/DESIGN.md §9). Rank 0's and rank 1's storage
    // swapped, holders left as they were: the map lies about who holds what, and the planner must
    // refuse it. Swapped with the holders made consistent: a valid map naming the wrong data,
    // which the planner accepts and the oracle comparison must catch.
    if (stage >= 1 && kWorld >= 2) {
      int controls = 0;
      for (const auto& [kind, buffer, map] : storage.maps) {
        if (kind != "exp_avg" || map.name != "gpt.wte.weight") continue;
        ++controls;
        auto swapped = map;
        std::swap(swapped.ranks.at(0), swapped.ranks.at(1));
        CHECK_THROWS_AS(rebuild(swapped, gathered.at(buffer)), tessera::MapError);
        tessera::affine::assign_holders_by_box(swapped);
        torch::Tensor full;
        REQUIRE_NOTHROW(full = rebuild(swapped, gathered.at(buffer)));
        CHECK_FALSE(torch::isnan(full).any().item<bool>());
        CHECK_FALSE(torch::equal(full, expected.at(kind).at(map.name)));
      }
      CHECK(controls == 1);
    }
  }
}

TEST_CASE("Storage maps of bf16 training: bf16 weights, fp32 master partitions", "[engine][storage]") {
  // Oracle: the same fp32 initialisation rounded to bf16, every rank's bf16 gradients summed in
  // fp32, divided by the world size and rounded once to bf16 (Gloo has no bf16 arithmetic; the
  // engine reduces so), fp32 masters stepped by LibTorch's AdamW and rounded into the weights.
  auto oracle = std::make_shared<Model>();
  auto params = oracle->parameters();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) p.set_data(p.to(torch::kBFloat16));
  }
  std::vector<torch::Tensor> masters;
  for (auto& p : params) masters.push_back(p.detach().to(torch::kFloat));
  torch::optim::AdamW opt(masters, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  for (int step = 0; step < 2; ++step) {
    std::vector<torch::Tensor> sums(params.size());
    for (int rank = 0; rank < kWorld; ++rank) {
      for (auto& p : params) p.mutable_grad() = torch::Tensor();
      oracle->loss(step, rank).backward();
      for (size_t i = 0; i < params.size(); ++i) {
        auto g = params[i].grad().to(torch::kFloat);
        sums[i] = rank == 0 ? g : sums[i].add_(g);
      }
    }
    for (size_t i = 0; i < params.size(); ++i) masters[i].mutable_grad() = sums[i].div_(kWorld).to(torch::kBFloat16).to(torch::kFloat);
    opt.step();
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(masters[i]);
  }
  std::map<std::string, torch::Tensor> expected_master;
  {
    auto named = oracle->named_parameters();
    for (size_t i = 0; i < params.size(); ++i) expected_master[named.keys()[i]] = masters[i].detach();
  }

  auto model = std::make_shared<Model>();
  auto engine = tessera::initialize(
      model, tessera::config::load_config_text(config(2, "[bf16]\nenabled = true\n"), tessera::config::Format::toml, "s")).engine;
  for (int step = 0; step < 2; ++step) {
    engine->backward(model->loss(step, kRank));
    engine->step();
  }
  auto storage = engine->storage_maps();
  CHECK(storage.buffers.at("param/0").scalar_type() == torch::kBFloat16);
  CHECK(storage.buffers.at("master/0").scalar_type() == torch::kFloat);
  std::map<std::string, std::vector<torch::Tensor>> gathered;
  for (const auto& [key, buffer] : storage.buffers) gathered[key] = gather(buffer);
  int checked = 0;
  for (const auto& [kind, buffer, map] : storage.maps) {
    if (kind != "param" && kind != "master") continue;
    INFO(kind << " of " << map.name);
    ++checked;
    auto full = rebuild(map, gathered.at(buffer));
    CHECK_FALSE(torch::isnan(full).any().item<bool>());
    const auto& want = expected_master.at(map.name);
    const auto expected = kind == "param" ? want.to(torch::kBFloat16) : want;
    CHECK(full.scalar_type() == expected.scalar_type());
    if (kWorld <= 2) CHECK(torch::equal(full, expected));
    else CHECK(torch::allclose(full.to(torch::kFloat), expected.to(torch::kFloat), 1e-2, 1e-4));
  }
  CHECK(checked == 2 * int(params.size()));
}

TEST_CASE("Storage maps of two parameter groups: each group's own buffers, states bitwise", "[engine][storage][groups]") {
  auto is_vector = [](const torch::Tensor& p) { return p.dim() < 2; };
  auto make_groups = [&](Model& m) {
    std::vector<torch::Tensor> matrices, vectors;
    for (auto& p : m.parameters()) (is_vector(p) ? vectors : matrices).push_back(p);
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(matrices, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(3e-3).weight_decay(0.01)));
    groups.emplace_back(vectors, std::make_unique<torch::optim::AdamWOptions>(torch::optim::AdamWOptions(1e-3).weight_decay(0.0)));
    return groups;
  };
  auto oracle = std::make_shared<Model>();
  torch::optim::AdamW opt(make_groups(*oracle), torch::optim::AdamWOptions(3e-3));
  auto params = oracle->parameters();
  for (int step = 0; step < 3; ++step) {
    average_rank_gradients(params, [&](int rank) { return oracle->loss(step, rank); });
    opt.step();
  }
  for (int stage : {1, 2}) {
    INFO("stage " << stage << " world " << kWorld);
    auto model = std::make_shared<Model>();
    tessera::InitializeOptions options;
    options.param_groups.resize(2);
    for (auto& item : model->named_parameters()) options.param_groups[is_vector(item.value()) ? 1 : 0].names.push_back(item.key());
    options.param_groups[1].lr = 1e-3;
    options.param_groups[1].weight_decay = 0.0;
    auto engine = tessera::initialize(model, tessera::config::load_config_text(config(stage), tessera::config::Format::toml, "s"), options).engine;
    for (int step = 0; step < 3; ++step) {
      engine->backward(model->loss(step, kRank));
      engine->step();
    }
    auto storage = engine->storage_maps();
    CHECK(storage.buffers.count("exp_avg/1") == 1);
    std::map<std::string, std::vector<torch::Tensor>> gathered;
    for (const auto& [key, buffer] : storage.buffers) gathered[key] = gather(buffer);
    auto named = oracle->named_parameters();
    for (const auto& [kind, buffer, map] : storage.maps) {
      INFO(kind << " of " << map.name << " in " << buffer);
      const auto& p = named[map.name];
      CHECK(buffer == kind + (is_vector(p) ? "/1" : "/0"));
      torch::Tensor expected = p.detach();
      auto& state = static_cast<torch::optim::AdamWParamState&>(*opt.state().at(c10::guts::to_string(p.unsafeGetTensorImpl())));
      if (kind == "exp_avg") expected = state.exp_avg();
      if (kind == "exp_avg_sq") expected = state.exp_avg_sq();
      auto full = rebuild(map, gathered.at(buffer));
      CHECK_FALSE(torch::isnan(full).any().item<bool>());
      if (kWorld <= 2) CHECK(torch::equal(full, expected));
      else CHECK(torch::allclose(full, expected, 1e-4, 1e-6));
    }
  }
}
