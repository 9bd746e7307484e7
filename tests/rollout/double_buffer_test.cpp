// Double-buffered sync under concurrent generation, across two jobs started by
// tests/transport/two_jobs.py (DP 2 at ZeRO 2 -> TP 2 or 4, over UCX on loopback). The rollout
// job's main thread generates without pause while its sink actor listens; the training job syncs
// three times, the second sync corrupted by one byte on one rollout rank.
// Proven here:
//   - generation runs while a sync is under way: after the second and third transfers the sink's
//     hook holds the sync open until a generation that began inside it has finished (forced, not hoped for: a
//     generate() that waited for the sync would never finish there, and the hook's 20 s wait would
//     fail the test);
//   - no generation ever read a torn version: every output recorded under version v equals,
//     bitwise, the same request generated afterwards with the oracle weights of v loaded whole;
//   - the corrupted sync is dropped on every rank and version 1 keeps serving; the next good sync
//     becomes version 2; the live weights then equal the training weights bit for bit;
//   - with delta syncs on (the third sync is full again: the failed one broke the chain).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/config/load.h"
#include "core/nn/decoder.h"
#include "tests/nn/decoder_models.h"
#include "tests/rollout/two_job_process.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

using testing::env;
using testing::kEnv;
using testing::kTraining;
const std::string kSession = "double_buffered";
const char* kCorrupted = "model.layers.0.mlp.up_proj.weight";

// The interleaving hook: the sink's thread opens a window after a transfer and waits until the
// main thread reports a generation that began while that window was open and has finished.
class SyncWindow {
 public:
  void hold_until_generation(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    ++opened_, open_ = true;
    if (!cv_.wait_for(lock, limit, [&] { return served_ == opened_; })) ++timed_out_;
    open_ = false;
  }
  // The window a generation starting now falls in (0: none open).
  uint64_t open_count() {
    std::lock_guard lock(mutex_);
    return open_ ? opened_ : 0;
  }
  // A generation begun in window `opened` has finished; true when that window is still open.
  bool generation_finished(uint64_t opened) {
    std::lock_guard lock(mutex_);
    if (opened == 0 || !open_ || opened != opened_) return false;
    served_ = opened;
    cv_.notify_all();
    return true;
  }
  int timed_out() {
    std::lock_guard lock(mutex_);
    return timed_out_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  uint64_t opened_ = 0, served_ = 0;
  bool open_ = false;
  int timed_out_ = 0;
};

fs::path oracle_dir(int version) {
  return fs::temp_directory_path() / ("tessera_double_" + env("MASTER_PORT") + "_v" + std::to_string(version));
}

WeightSyncOptions sync_options() {
  WeightSyncOptions o;
  o.train_job = kTraining ? kEnv.job : env("TESSERA_PEER_JOB");
  o.rollout_job = kTraining ? env("TESSERA_PEER_JOB") : kEnv.job;
  o.session = kSession;
  o.timeout = std::chrono::seconds(60);
  o.replica_policy = tessera::affine::ReplicaPolicyKind::balanced;
  o.delta = true;
  o.mode = SinkMode::double_buffered;
  return o;
}

void train() {
  auto config = nn::testing::family_config("llama");
  nn::DecoderOptions mo;
  mo.seed = 5;
  nn::DecoderLm model(config, mo);
  nn::testing::randomize_norms_and_biases(model.module(), 6);
  const auto toml =
      "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-2\n"
      "[zero_optimization]\nstage = 2\n[tessera.transport]\ncollective_timeout_ms = 60000\n";
  auto engine = initialize(model.module(), config::load_config_text(toml, config::Format::toml, "double_test")).engine;
  WeightSender sender(*engine, config, sync_options());
  auto marks = actors::job_store()->shared("doubletest");
  uint64_t version = 0;
  for (int round = 0; round < 3; ++round) {
    for (int step = 0; step < 2; ++step) {
      auto g = at::detail::createCPUGenerator(uint64_t(100 * round + 10 * step + kEnv.rank));
      auto tokens = torch::randint(0, config.vocab_size, {2, 9}, g, torch::kLong);
      engine->backward(model.loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)));
      engine->step();
    }
    if (round == 1) {
      CHECK_THROWS_WITH(sender.sync(), Catch::Contains("did not verify") && Catch::Contains(kCorrupted));
      continue;
    }
    const auto stats = sender.sync();
    CHECK_FALSE(stats.delta);  // round 0: the first; round 2: after a failed one
    ++version;
    if (kEnv.rank == 0) {
      model.save_pretrained(oracle_dir(int(version)).string());
      marks->set("saved" + std::to_string(version), "1");
    }
  }
  // This job's rank 0 hosts the store the rollout job still reads: stay until it is done.
  std::vector<std::string> done;
  for (int r = 0; r < std::stoi(marks->get_string("rollout_size", std::chrono::seconds(120))); ++r)
    done.push_back("done" + std::to_string(r));
  marks->wait(done, std::chrono::seconds(120));
}

void generate_while_syncing() {
  const auto config = nn::testing::family_config("llama");
  const auto dir = fs::temp_directory_path() / ("tessera_double_cfg_" + env("MASTER_PORT") + "_" + std::to_string(kEnv.rank));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << nn::decoder_config_json(config);
  RolloutOptions ro;
  ro.config_path = (dir / "config.json").string();
  auto rollout = RolloutEngine::create(ro);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : rollout->model().module()->parameters()) p.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  // After each transfer and before its verdict: hold the sync open until a generation begun inside
  // it has finished (the main loop signals), and on the last rollout rank corrupt one byte of the
  // second sync.
  auto options = sync_options();
  auto window = std::make_shared<SyncWindow>();
  auto syncs_seen = std::make_shared<std::atomic<int>>(0);
  const bool corrupter = kEnv.rank == kEnv.world_size - 1;
  options.tamper_for_testing = [=](const std::string& name, at::Tensor& local) {
    if (name == "model.embed_tokens.weight") {
      // The first sync is awaited by the main thread (nothing to generate with yet); the two after
      // it run beside generation.
      if (syncs_seen->load() > 0) window->hold_until_generation(std::chrono::seconds(20));
      ++*syncs_seen;
    }
    if (name == kCorrupted && corrupter && syncs_seen->load() == 2) reinterpret_cast<uint8_t*>(local.data_ptr())[3] ^= 0x20;
  };
  RolloutSink sink(*rollout, options);
  sink.listen();
  sink.wait_for_version(1, std::chrono::seconds(60));
  const std::vector<std::vector<int64_t>> prompts = {{3, 4, 5}, {6, 7}};
  nn::SamplingParams greedy;
  greedy.temperature = 0, greedy.max_new_tokens = 6, greedy.ignore_eos = true;
  std::map<uint64_t, nn::GenerationResult> seen;  // first output under each version
  int during_sync = 0, generations = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  // Every rank runs the loop in lockstep: versions change only inside generate(), alike on all.
  while (rollout->weight_version() < 2 && std::chrono::steady_clock::now() < deadline) {
    const uint64_t opened = window->open_count();
    const auto out = rollout->generate(prompts, greedy);
    ++generations;
    if (window->generation_finished(opened)) ++during_sync;
    const uint64_t v = rollout->weight_version();
    auto it = seen.find(v);
    if (it == seen.end()) {
      seen[v] = out;
    } else {
      CHECK(out.tokens == it->second.tokens);
      CHECK(out.logprobs == it->second.logprobs);  // bitwise: the same version, never a mix
    }
  }
  sink.stop();
  REQUIRE(rollout->weight_version() == 2);
  CHECK(syncs_seen->load() == 3);
  CHECK(window->timed_out() == 0);  // both later syncs saw a generation run inside them
  CHECK(during_sync >= 2);
  CHECK(seen.count(1) == 1);
  CHECK(seen.count(2) == 1);
  std::printf("rollout rank %d: %d generations, %d begun during a sync, last swap %.3f ms\n", kEnv.rank, generations,
              during_sync, rollout->last_swap_ms());
  // The oracle of each version, loaded whole: the same outputs, bit for bit.
  auto marks = actors::job_store()->shared("doubletest");
  marks->get("saved2", std::chrono::seconds(60));
  {
    const auto live = rollout->model().module()->named_parameters();
    const auto oracle = nn::load_pretrained(oracle_dir(2).string());
    for (const auto& item : oracle.module()->named_parameters()) {
      const auto shard = nn::decoder_tp_shard(config, item.key(), kEnv.rank, kEnv.world_size);
      INFO(item.key());
      auto got = live[item.key()].detach(), expected = nn::cut_shard(item.value().detach(), shard);
      if (shard.dim >= 0 && shard.local_length > shard.length)  // padding rows stay outside the map
        got = got.narrow(shard.dim, 0, shard.length), expected = expected.narrow(shard.dim, 0, shard.length);
      CHECK(torch::equal(got, expected));
    }
  }
  for (uint64_t v : {uint64_t(1), uint64_t(2)}) {
    marks->get("saved" + std::to_string(v), std::chrono::seconds(60));
    rollout->load_weights(oracle_dir(int(v)).string());
    const auto again = rollout->generate(prompts, greedy);
    CHECK(again.tokens == seen[v].tokens);
    CHECK(again.logprobs == seen[v].logprobs);
  }
  fs::remove_all(dir);
  if (kEnv.rank == 0) marks->set("rollout_size", std::to_string(kEnv.world_size));
  marks->set("done" + std::to_string(kEnv.rank), "1");
}

}  // namespace

TEST_CASE("A double-buffered sink syncs while generation runs; no generation reads a torn version", "[.double]") {
  if (kTraining) {
    train();
    if (kEnv.rank == 0)
      for (int v : {1, 2}) fs::remove_all(oracle_dir(v));
  } else {
    generate_while_syncing();
  }
}
