// ZeRO stage 3's storage and scopes against independent oracles: storage maps rebuilt over plain
// all-gathers into NaN-filled tensors (they must equal the gathered weights and stage 2's masters and
// states), and gathered_parameters() scopes (a backward inside one, step() refused inside one, a
// second initialize on a held model, memory freed when the scope ends) against stage 2.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/affine/affine_map.h"
#include "core/affine/builders.h"  // replicated
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "tests/engine/stage3_test_support.h"
#include "transport/communicator.h"

namespace {

using namespace tessera::stage3_testing;

// Every rank's `mine` (one size on all ranks), indexed by rank.
std::vector<torch::Tensor> gather_buffers(const torch::Tensor& mine) {
  static std::shared_ptr<tessera::transport::Communicator> world = [] {
    tessera::transport::CommunicatorOptions o;
    o.name = "stage3_test";
    o.timeout = std::chrono::seconds(60);
    return tessera::transport::Communicator::gloo(tessera::actors::job_store(), kRank, kWorld, o);
  }();
  auto flat = mine.contiguous().view(-1);
  auto all = torch::empty({flat.numel() * kWorld}, flat.options());
  if (kWorld == 1) all.copy_(flat);
  else world->all_gather(flat, all)->wait();
  return all.chunk(kWorld);
}

// The full (fp32) tensor a map describes, rebuilt from every rank's buffer into a NaN-filled target.
torch::Tensor rebuild(const tessera::affine::TensorMap& map, const std::vector<torch::Tensor>& buffers) {
  auto plan = tessera::affine::plan(tessera::affine::replicated({map.name, map.dtype, map.shape}, 1), map);
  auto full = torch::full(map.shape.to_vector(), std::nan(""), torch::TensorOptions().dtype(torch::kFloat));
  tessera::affine::LocalTransfer transfer;
  transfer.plan = &plan;
  for (int r = 0; r < kWorld; ++r) transfer.source_buffers[r] = {buffers[r].data_ptr(), buffers[r].numel(), map.dtype};
  transfer.target_buffers[0] = {full.data_ptr(), full.numel(), map.dtype};
  tessera::affine::execute_local({transfer});
  return full;
}

// kind -> name -> the full tensor, from every rank's storage.
std::map<std::string, Params> rebuild_all(const tessera::EngineStorage& storage) {
  std::map<std::string, std::vector<torch::Tensor>> gathered;
  for (const auto& [key, buffer] : storage.buffers) gathered[key] = gather_buffers(buffer);
  std::map<std::string, Params> out;
  for (const auto& [kind, buffer, map] : storage.maps) out[kind][map.name] = rebuild(map, gathered.at(buffer));
  return out;
}

}  // namespace

TEST_CASE("Stage-3 storage maps rebuild the gathered weights bitwise, and masters and states equal stage 2's",
          "[engine][stage3][storage]") {
  tessera::nn::TinyGpt m(gpt()), m2(gpt());
  auto e = make_engine(m.module(), config_text(3)), e2 = make_engine(m2.module(), config_text(2));
  const auto weights = train(m, *e, 3);
  train(m2, *e2, 3);
  const auto storage = e->storage_maps();
  REQUIRE(storage.maps.size() == 4 * weights.size());  // param, master, exp_avg, exp_avg_sq
  const auto full = rebuild_all(storage), full2 = rebuild_all(e2->storage_maps());
  for (const std::string kind : {"param", "master", "exp_avg", "exp_avg_sq"}) {
    REQUIRE(full.at(kind).size() == weights.size());
    for (const auto& [name, t] : full.at(kind)) {
      INFO(kind << " of " << name);
      CHECK_FALSE(torch::isnan(t).any().item<bool>());
      // fp32: the master is the weights' partition, so both rebuild to the gathered weights.
      if (kind == "param" || kind == "master") CHECK(torch::equal(t, weights.at(name)));
      if (kWorld <= 2) CHECK(torch::equal(t, full2.at(kind).at(name)));
      else CHECK(torch::allclose(t, full2.at(kind).at(name), 1e-4, 1e-6));
    }
  }
  // for_each_gathered_parameter: every parameter once, with its trained value; units released after.
  std::map<std::string, int> seen;
  e->for_each_gathered_parameter([&](const std::string& name, const at::Tensor& w) {
    ++seen[name];
    CHECK(torch::equal(w, weights.at(name)));
  });
  CHECK(seen.size() == weights.size());
  for (const auto& [name, n] : seen) CHECK(n == 1);
  expect_released(*e, 100, true);
}

TEST_CASE("A backward inside a gathered_parameters() scope, step outside, equals stage 2", "[engine][stage3]") {
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3));
  for (int step = 0; step < 3; ++step) {
    {
      auto scope = e->gathered_parameters({"h.0.mlp.c_fc.weight", "lm_head.weight", "h.1.ln_1.bias"});
      e->backward(rank_loss(m, step, 0, kRank));
      (void)e->memory();  // the shard has handled the backward's releases
      CHECK(m.module()->named_parameters()["lm_head.weight"].storage().nbytes() > 0);
      CHECK(m.module()->named_parameters()["wte.weight"].storage().nbytes() == 0);
    }
    e->step();
  }
  expect_same(gathered_snapshot(*e), run_gpt(2, 100, 3));
}

TEST_CASE("A second initialize on a model a live stage-3 engine holds is refused before anything changes",
          "[engine][stage3]") {
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3));
  {
    // Inside a scope the parameters have memory: the refusal comes from the unit registry.
    auto scope = e->gathered_parameters();
    CHECK_THROWS_WITH(make_engine(m.module(), config_text(3)), Catch::Contains("another live engine"));
  }
  // Outside one they have none: refused (not a crash), at any stage.
  for (int stage : {2, 3})
    CHECK_THROWS_WITH(make_engine(m.module(), config_text(stage)), Catch::Contains("has no memory"));
  {
    auto scope = e->gathered_parameters();
    for (auto& item : m.module()->named_parameters()) {
      INFO(item.key() << " nbytes " << item.value().storage().nbytes());
      REQUIRE(item.value().storage().nbytes() > 0);  // the first engine still owns its weights
    }
  }
  expect_same(train(m, *e, 2), run_gpt(3, 100, 2));
}

TEST_CASE("step() inside a gathered_parameters() scope is refused; after the scope it updates as usual",
          "[engine][stage3]") {
  // A pinned unit would keep its pre-step values while the partitions move on.
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3));
  {
    auto scope = e->gathered_parameters();
    e->backward(rank_loss(m, 0, 0, kRank));
    CHECK_THROWS_WITH(e->step(), Catch::Contains("gathered_parameters"));
  }
  e->step();
  e->backward(rank_loss(m, 1, 0, kRank));
  e->step();
  expect_same(gathered_snapshot(*e), run_gpt(2, 100, 2));
}

TEST_CASE("A unit's memory is freed when its gathered_parameters() scope ends", "[engine][stage3]") {
  // The scope's end waits for the parameter-shard to release (a unit's forward and a backward's
  // end only send the release).
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3));
  auto weight = m.module()->named_parameters()["lm_head.weight"];
  int late = 0;
  for (int i = 0; i < 20; ++i) {
    { auto scope = e->gathered_parameters({"lm_head.weight"}); }
    late += weight.storage().nbytes() > 0 ? 1 : 0;
  }
  CHECK(late == 0);
}
