// DeepSpeed checkpoints resumed by tessera's engine, against DeepSpeed's own digests (the oracle:
// ../shared/fixtures/deepspeed_checkpoints/README.md). The fixture's MLP (torch::manual_seed(1234);
// Linear(256, 64), ReLU, Linear(64, 64), ReLU, Linear(64, 16) as torch::nn::Sequential, names
// 0.weight ... 4.bias), its config (Adam lr 1e-3 through torch_adam, batch 32 per rank), its data
// (step s on rank r: x = randn(32, 256), then y = randn(32, 16) from a generator seeded 10000 s + r;
// MSE). Digest: sha256 over the parameters' float32 bytes in model order, first 16 hex digits.
// The digests after training hold under the fixtures' OpenBLAS kernels (AVX2: Haswell, Zen; ctest
// sets OPENBLAS_CORETYPE=Haswell, tests/checkpoint/CMakeLists.txt); AVX-512 kernels end elsewhere.
//   [np2]  each of ZeRO-1/2/3 and the universal format (from ZeRO-2) loaded at its stage on 2 ranks:
//          d39d9ee736d02b07 right after the load,
//          3033dbc6e22eb116 after steps 5..9 (DeepSpeed's resumed = uninterrupted run); a negative
//          control (the imported optimizer step set to 0) ends elsewhere.
//   [np1]  the 2-rank ZeRO-2 checkpoint, sharded and universal, loaded at 1 rank: weights, masters
//          and Adam's states equal DeepSpeed's partitions gathered, bitwise.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/deepspeed/ds_checkpoint.h"
#include "core/checkpoint/deepspeed/import.h"
#include "core/checkpoint/manifest.h"
#include "core/config/load.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"
#include "tests/checkpoint/fixture_digest.h"

namespace fs = std::filesystem;
namespace ck = tessera::checkpoint;

namespace {

const int kRank = tessera::transport::LaunchEnv::from_env().rank;
const int kWorld = tessera::transport::LaunchEnv::from_env().world_size;
constexpr const char* kAfterLoad = "d39d9ee736d02b07";
constexpr const char* kAfterTraining = "3033dbc6e22eb116";

std::string fixture(const std::string& name) {
  const fs::path path = fs::path(TESSERA_DS_FIXTURES) / name;
  INFO("DeepSpeed fixture " << path << " (../shared/fixtures/deepspeed_checkpoints)");
  REQUIRE(fs::exists(path));
  return path.string();
}

tessera::transport::Communicator& test_comm() {
  static auto comm = [] {
    tessera::transport::CommunicatorOptions o;
    o.name = "deepspeed_engine_test";
    o.timeout = std::chrono::seconds(120);
    return tessera::transport::Communicator::gloo(tessera::actors::job_store(), kRank, kWorld, o);
  }();
  return *comm;
}
void barrier() {
  if (kWorld > 1) test_comm().barrier()->wait();
}

torch::nn::Sequential fixture_mlp() {
  torch::manual_seed(1234);
  torch::nn::Sequential m;
  m->push_back(torch::nn::Linear(256, 64));
  m->push_back(torch::nn::ReLU());
  m->push_back(torch::nn::Linear(64, 64));
  m->push_back(torch::nn::ReLU());
  m->push_back(torch::nn::Linear(64, 16));
  return m;
}

// The fixture's ds_config, with torch_adam: torch.optim.Adam's arithmetic.
std::shared_ptr<tessera::Engine> engine_for(const torch::nn::Sequential& m, int stage) {
  const std::string json =
      R"({"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1, "steps_per_print": 1000000000,
          "zero_optimization": {"stage": )" + std::to_string(stage) +
      R"(, "contiguous_gradients": true, "overlap_comm": false, "reduce_bucket_size": 5e7, "allgather_bucket_size": 5e7},
          "gradient_clipping": 0.0, "wall_clock_breakdown": false,
          "optimizer": {"type": "Adam", "params": {"lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-08, "weight_decay": 0.0,
                                                   "torch_adam": true}}})";
  auto config = tessera::config::load_config_text(json, tessera::config::Format::json, "deepspeed_engine_test");
  return tessera::initialize(m.ptr(), config).engine;
}

std::string digest(tessera::Engine& e, torch::nn::Sequential m) {
  auto scope = e.gathered_parameters();  // ZeRO-3: the whole weights; else a no-op
  std::vector<torch::Tensor> floats;
  std::vector<std::pair<const void*, size_t>> bytes;
  for (const auto& p : m->parameters()) {
    floats.push_back(p.detach().to(torch::kFloat).contiguous());
    bytes.emplace_back(floats.back().data_ptr(), size_t(floats.back().numel()) * 4);
  }
  return tessera::testing::fixture_digest(bytes);
}

void train(tessera::Engine& e, torch::nn::Sequential m, int from, int to) {
  for (int s = from; s < to; ++s) {
    auto gen = at::detail::createCPUGenerator(uint64_t(10000 * s + kRank));
    auto x = torch::randn({32, 256}, gen);
    auto y = torch::randn({32, 16}, gen);
    e.backward(torch::mse_loss(m->forward(x), y));
    e.step();
  }
}

std::string shared_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("tessera_ds_engine_" + std::to_string(kWorld) + "_" + name);
  if (kRank == 0) fs::remove_all(dir);
  barrier();
  return dir.string();
}

}  // namespace

TEST_CASE("ZeRO-1/2/3 and universal DeepSpeed checkpoints resume bitwise at 2 ranks: DeepSpeed's digests", "[np2]") {
  REQUIRE(kWorld == 2);
  for (const auto& [name, stage] : std::vector<std::pair<std::string, int>>{
           {"z1_fp32", 1}, {"z2_fp32", 2}, {"z3_fp32", 3}, {"z2_fp32_universal", 2}}) {
    INFO(name);
    auto m = fixture_mlp();
    auto e = engine_for(m, stage);
    const auto loaded = e->load_checkpoint(fixture(name));  // imported on the fly
    CHECK(loaded.tag == "global_step5");
    CHECK(e->global_steps() == 5);
    CHECK(digest(*e, m) == kAfterLoad);
    train(*e, m, 5, 10);
    CHECK(digest(*e, m) == kAfterTraining);
  }
}

TEST_CASE("Imported first, then loaded; a wrong optimizer step ends on another digest", "[np2]") {
  REQUIRE(kWorld == 2);
  const auto out = shared_dir("imported");
  if (kRank == 0) ck::deepspeed::import_deepspeed(fixture("z2_fp32"), out);
  barrier();
  {
    auto m = fixture_mlp();
    auto e = engine_for(m, 2);
    e->load_checkpoint(out);
    CHECK(digest(*e, m) == kAfterLoad);
    train(*e, m, 5, 10);
    CHECK(digest(*e, m) == kAfterTraining);
  }
  // Negative control: Adam's step count 0 instead of 5 (bias corrections start over).
  barrier();
  if (kRank == 0) {
    const auto path = (fs::path(out) / "global_step5" / ck::kManifestName).string();
    auto manifest = ck::manifest_from_json(ck::read_text(path), path);
    manifest.engine.optimizer_updates = 0;
    fs::remove(path);
    std::ofstream(path) << ck::to_json(manifest);
  }
  barrier();
  auto m = fixture_mlp();
  auto e = engine_for(m, 2);
  e->load_checkpoint(out);
  CHECK(digest(*e, m) == kAfterLoad);  // the weights are the same
  train(*e, m, 5, 10);
  CHECK(digest(*e, m) != kAfterTraining);
  barrier();
  if (kRank == 0) fs::remove_all(out);
}

TEST_CASE("A 2-rank ZeRO-2 checkpoint, sharded or universal, loaded at 1 rank holds DeepSpeed's tensors gathered", "[np1]") {
  REQUIRE(kWorld == 1);
  const auto ds = ck::deepspeed::read_deepspeed_checkpoint(fixture("z2_fp32"));
  auto gathered = [&](const std::vector<std::vector<char>>& ranks) {
    std::vector<char> all;
    for (const auto& r : ranks) all.insert(all.end(), r.begin(), r.end());
    return torch::from_blob(all.data(), {int64_t(all.size() / 4)}, torch::kFloat).narrow(0, 0, 21648).clone();
  };
  for (const auto& [name, stage] : std::vector<std::pair<std::string, int>>{
           {"z2_fp32", 1}, {"z2_fp32", 2}, {"z2_fp32", 3}, {"z2_fp32_universal", 2}, {"z2_fp32_universal", 3}}) {
    INFO(name << " at stage " << stage);
    auto m = fixture_mlp();
    auto e = engine_for(m, stage);
    e->load_checkpoint(fixture(name));
    CHECK(digest(*e, m) == kAfterLoad);
    const auto storage = e->storage_maps();
    CHECK(torch::equal(storage.buffers.at("master/0").view({-1}).narrow(0, 0, 21648), gathered(ds.groups[0].master)));
    CHECK(torch::equal(storage.buffers.at("exp_avg/0").view({-1}).narrow(0, 0, 21648), gathered(ds.groups[0].states.at("exp_avg"))));
    CHECK(torch::equal(storage.buffers.at("exp_avg_sq/0").view({-1}).narrow(0, 0, 21648),
                       gathered(ds.groups[0].states.at("exp_avg_sq"))));
  }
}
