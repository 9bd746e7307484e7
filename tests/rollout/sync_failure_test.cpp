// Weight sync under bad input, over real UCX between separately launched jobs (the ctest entries
// in CMakeLists.txt start them; TESSERA_UCX_ROLE says which side a process is):
//   [.sync_sabotaged_map]   training rank 0 publishes source maps in which two training ranks'
//       pieces of one parameter are swapped (each claims the other's half of q_proj). The sender
//       plans with its true maps, the rollout job with the published ones, so the transfer's
//       agreement on plan digests refuses the sync on every process of both jobs with one and the
//       same error before any byte moves: the rollout weights keep the previous version's bytes,
//       weight_version() does not move, and the next good sync goes through. (A literal swap of
//       two ranks' storage is also checked: at ZeRO 1/2 every rank holds every weight at the same
//       offset, so it leaves the maps identical: nothing to detect, nothing wrong.)
//   [.sync_rank_killed]     with replica_policy "balanced" (both training ranks send), training
//       rank 1 SIGKILLs itself just before its transfer on the second sync. Every rollout rank gets
//       an error naming the store key it waited for, within the sync timeout (8 s; the time from
//       the kill is printed), and keeps version 1 with the weights marked torn (generation
//       refuses; no byte moved: the kill precedes rank 1's vote). Started by sync_failure.py,
//       which expects the training job to fail (its launcher ends rank 0 as well); with
//       TESSERA_SYNC_STORE_HOST=rollout the store outlives the training job and the error must be
//       the timeout itself.
//   [.sync_rollout_not_up]  a training job whose rollout job never starts: WeightSender throws a
//       TimeoutError naming the session and the rollout job within its 3 s timeout, on every
//       training rank.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "core/affine/serialize.h"
#include "core/affine/validate.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "core/nn/tp_maps.h"
#include "tests/nn/decoder_models.h"
#include "tests/rollout/two_job_process.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace fs = std::filesystem;
using namespace tessera;
using Clock = std::chrono::steady_clock;

namespace {

using testing::env;
using testing::kEnv;
using testing::kTraining;

double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// CLOCK_MONOTONIC in ms: one clock for every process of the machine (steady_clock is this clock
// on Linux), so a kill in one process can be timed from another.
double monotonic_ms() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}


WeightSyncOptions sync_options(const std::string& session, std::chrono::milliseconds timeout) {
  WeightSyncOptions o;
  o.train_job = kTraining ? kEnv.job : env("TESSERA_PEER_JOB");
  o.rollout_job = kTraining ? env("TESSERA_PEER_JOB") : kEnv.job;
  o.session = session;
  o.timeout = timeout;
  o.replica_policy = tessera::affine::ReplicaPolicyKind::balanced;
  return o;
}

struct TrainingSide {
  nn::DecoderConfig config;
  std::unique_ptr<nn::DecoderLm> model;
  std::shared_ptr<Engine> engine;

  explicit TrainingSide(int stage) : config(nn::testing::family_config("llama")) {
    nn::DecoderOptions o;
    o.seed = 7;
    model = std::make_unique<nn::DecoderLm>(config, o);
    nn::testing::randomize_norms_and_biases(model->module(), 8);
    engine = initialize(model->module(), config::load_config_text(testing::sync_test_engine_toml(stage), config::Format::toml, "sync_failure"))
                 .engine;
  }

  void train_step(int seed) {
    auto g = at::detail::createCPUGenerator(uint64_t(100 * seed + kEnv.rank));
    auto tokens = torch::randint(0, config.vocab_size, {2, 9}, g, torch::kLong);
    engine->backward(model->loss(tokens.narrow(1, 0, 8), tokens.narrow(1, 1, 8)));
    engine->step();
  }
};

// A TP rollout engine over the llama test model, every weight NaN until a sync writes it.
std::unique_ptr<RolloutEngine> nan_rollout_engine() {
  const auto dir = fs::temp_directory_path() /
                   ("tessera_syncfail_cfg_" + env("MASTER_PORT") + "_" + std::to_string(kEnv.rank));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << nn::decoder_config_json(nn::testing::family_config("llama"));
  RolloutOptions ro;
  ro.config_path = (dir / "config.json").string();
  auto rollout = RolloutEngine::create(ro);
  fs::remove_all(dir);
  torch::NoGradGuard no_grad;
  for (auto& p : rollout->model().module()->parameters()) p.fill_(std::numeric_limits<float>::quiet_NaN());
  return rollout;
}

// The bytes of every local weight (NaN padding included, which torch::equal would refuse).
std::map<std::string, std::vector<char>> weight_bytes(RolloutEngine& rollout) {
  std::map<std::string, std::vector<char>> out;
  for (const auto& item : rollout.model().module()->named_parameters()) {
    const auto& p = item.value();
    const auto* data = static_cast<const char*>(p.data_ptr());
    out[item.key()].assign(data, data + p.numel() * p.element_size());
  }
  return out;
}

// Both sides construct their end of a session only once the other side is about to: so the short
// sync timeouts below bound the sync, not how long the other job took to start.
void meet_before_constructing(const std::shared_ptr<transport::Store>& marks, int train_size, int rollout_size) {
  marks->set(std::string(kTraining ? "train" : "rollout") + "_ready/" + std::to_string(kEnv.rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < train_size; ++r) keys.push_back("train_ready/" + std::to_string(r));
  for (int r = 0; r < rollout_size; ++r) keys.push_back("rollout_ready/" + std::to_string(r));
  marks->wait(keys, std::chrono::seconds(60));
}

constexpr const char* kSabotagedTensor = "model.layers.0.self_attn.q_proj.weight";

// Training ranks 0 and 1 each claim the other's half of kSabotagedTensor's rows (its storage
// address of rows [0, h) moved to rows [h, 2h) and back): a valid map, planned without complaint,
// that would deliver the two halves crossed.
void swap_halves_between_ranks(std::string& json) {
  auto maps = affine::maps_from_json(json);
  for (auto& m : maps) {
    if (m.name != kSabotagedTensor) continue;
    REQUIRE(m.ranks.size() == 2);
    const int64_t rows = m.shape[0], cols = m.shape[1], half = rows / 2;
    REQUIRE(rows % 2 == 0);
    for (auto& [rank, storage] : m.ranks) {
      REQUIRE(storage.pieces.size() == 1);
      auto& piece = storage.pieces[0];  // the whole tensor, row-major, at the same offset on both ranks
      REQUIRE(piece.box == affine::Box::whole(m.shape));
      REQUIRE(piece.strides == affine::Dims({cols, 1}));
      // Rank 0: rows [0, h) where rows [h, 2h) are stored; rank 1: rows [h, 2h) where rows [0, h) are.
      piece.box = affine::Box(affine::Dims({rank == 0 ? 0 : half, 0}), affine::Dims({half, cols}));
      if (rank == 0) piece.offset += half * cols;
      piece.holders = {rank};
    }
  }
  json = affine::maps_to_json(maps);
}

// The literal swap: rank 0's storage of one parameter exchanged with rank 1's.
std::string swap_rank_storage(const std::string& json) {
  auto maps = affine::maps_from_json(json);
  for (auto& m : maps)
    if (m.name == kSabotagedTensor) std::swap(m.ranks.at(0), m.ranks.at(1));
  return affine::maps_to_json(maps);
}

}  // namespace

TEST_CASE("A source map with two training ranks' pieces swapped is refused on every process, no byte moved",
          "[.sync_sabotaged_map]") {
  auto marks = actors::job_store()->shared("syncfail/sabotage");
  const int train_size = kTraining ? kEnv.world_size : std::stoi(env("TESSERA_PEER_NPROC"));
  const int rollout_size = kTraining ? std::stoi(env("TESSERA_PEER_NPROC")) : kEnv.world_size;
  auto good_options = sync_options("sabotage_good", std::chrono::seconds(60));
  auto bad_options = sync_options("sabotage_bad", std::chrono::seconds(60));
  std::string refusal;
  if (kTraining) {
    TrainingSide side(2);
    // The literal swap is the identity at ZeRO 1/2: every rank holds the same bytes at the same
    // offset, so there is nothing to catch and nothing that would go wrong.
    // The halves swap is a valid map whose plan differs: it would deliver crossed rows.
    for (const auto& m : side.engine->storage_maps().maps)
      if (m.kind == "param" && m.map.name == kSabotagedTensor) {
        const auto one = affine::maps_to_json({m.map});
        CHECK(swap_rank_storage(one) == one);
        auto sabotaged_json = one;
        swap_halves_between_ranks(sabotaged_json);
        const auto sabotaged = affine::maps_from_json(sabotaged_json).at(0);
        CHECK_NOTHROW(affine::validate_map(sabotaged));
        const auto target = nn::decoder_tp_map(side.config, kSabotagedTensor, rollout_size, affine::DType::f32);
        CHECK(affine::plan(target, sabotaged).digest() != affine::plan(target, m.map).digest());
      }
    if (kEnv.rank == 0) bad_options.tamper_published_maps_for_testing = swap_halves_between_ranks;
    meet_before_constructing(marks, train_size, rollout_size);
    WeightSender good(*side.engine, side.config, good_options);
    WeightSender bad(*side.engine, side.config, bad_options);
    side.train_step(1);
    CHECK(good.sync().bytes_sent > 0);
    side.train_step(2);
    try {
      bad.sync();
      FAIL("the sabotaged sync went through");
    } catch (const affine::TransferRefusedError& e) {
      refusal = e.what();
    }
    CHECK(good.sync().bytes_sent > 0);  // the same weights, through the good session: version 2
  } else {
    auto rollout = nan_rollout_engine();
    meet_before_constructing(marks, train_size, rollout_size);
    RolloutSink good(*rollout, good_options);
    RolloutSink bad(*rollout, bad_options);
    CHECK(good.receive().version == 1);
    const auto version1 = weight_bytes(*rollout);
    try {
      bad.receive();
      FAIL("the sabotaged sync went through");
    } catch (const affine::TransferRefusedError& e) {
      refusal = e.what();
    }
    CHECK(rollout->weight_version() == 1);
    CHECK(weight_bytes(*rollout) == version1);  // no byte moved
    // Refused before its first byte: version 1 keeps serving.
    CHECK_FALSE(rollout->weights_torn());
    CHECK(rollout->generate({{1}}, {}).tokens.size() == 1);
    const auto next = good.receive();
    CHECK(next.version == 2);
    CHECK_FALSE(rollout->weights_torn());
    CHECK(weight_bytes(*rollout) != version1);  // trained on: the next good sync moved every weight
    CHECK(rollout->generate({{1}}, {}).tokens.size() == 1);
  }
  INFO(refusal);
  CHECK_THAT(refusal, Catch::Contains("remote transfer 'sync/sabotage_bad' #1 refused on every process, no byte moved") &&
                          Catch::Contains("the processes planned different batches") && Catch::Contains("digest") &&
                          Catch::Contains(std::string("tensor '") + kSabotagedTensor + "' is planned differently"));
  // One and the same error on every process of both jobs.
  const std::string me = std::string(kTraining ? "train" : "rollout") + "/" + std::to_string(kEnv.rank);
  marks->set("refusal/" + me, refusal);
  std::vector<std::string> all;
  for (int r = 0; r < train_size; ++r) all.push_back("refusal/train/" + std::to_string(r));
  for (int r = 0; r < rollout_size; ++r) all.push_back("refusal/rollout/" + std::to_string(r));
  for (const auto& key : all) CHECK(marks->get_string(key, std::chrono::seconds(60)) == refusal);
  if (kEnv.rank == 0 && !kTraining) std::printf("sabotaged map refused everywhere with: %s\n", refusal.c_str());
  // The training job hosts the store: it leaves last.
  marks->set("done/" + me, "1");
  if (kTraining) {
    std::vector<std::string> done;
    for (int r = 0; r < rollout_size; ++r) done.push_back("done/rollout/" + std::to_string(r));
    marks->wait(done, std::chrono::seconds(60));
    // The last set was handled, but its reply may still be on its way: give it time before the
    // store's host exits (else that rank's set fails with "connection to the store was lost").
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

TEST_CASE("A training rank killed mid-sync: the rollout job errs within the sync timeout and keeps its version",
          "[.sync_rank_killed]") {
  constexpr auto kSyncTimeout = std::chrono::seconds(8);
  const bool store_on_rollout = env("TESSERA_SYNC_STORE_HOST") == "rollout";
  auto marks = actors::job_store()->shared("syncfail/killed");
  const int train_size = kTraining ? kEnv.world_size : std::stoi(env("TESSERA_PEER_NPROC"));
  const int rollout_size = kTraining ? std::stoi(env("TESSERA_PEER_NPROC")) : kEnv.world_size;
  auto options = sync_options("killed", kSyncTimeout);
  const std::string kill_file = env("TESSERA_SYNC_KILL_FILE");
  // With the store on the training job: rank 1 dies after putting its bytes (before the hashes),
  // so the weights are partly overwritten. With the store on the rollout job: before its vote, so
  // no byte moved.
  const bool kill_after_transfer = !store_on_rollout;
  REQUIRE(!kill_file.empty());
  if (kTraining) {
    REQUIRE(train_size == 2);
    if (kEnv.rank == 1) {
      auto kill_in_sync_1 = [kill_file](uint64_t sync) {
        if (sync != 1) return;
        std::ofstream(kill_file) << std::fixed << monotonic_ms() << "\n";
        ::kill(::getpid(), SIGKILL);
      };
      if (kill_after_transfer) options.after_transfer_for_testing = kill_in_sync_1;
      else options.before_transfer_for_testing = kill_in_sync_1;
    }
    TrainingSide side(2);
    meet_before_constructing(marks, train_size, rollout_size);
    WeightSender sender(*side.engine, side.config, options);
    CHECK(sender.sync().bytes_sent > 0);  // balanced: both training ranks send
    side.train_step(1);
    sender.sync();  // rank 1 dies in it; the launcher then ends rank 0 (Catch reports its SIGTERM)
    FAIL("training rank " << kEnv.rank << " came back from the sync its peer was killed in");
  } else {
    auto rollout = nan_rollout_engine();
    meet_before_constructing(marks, train_size, rollout_size);
    RolloutSink sink(*rollout, options);
    const auto first = sink.receive();
    CHECK(first.version == 1);
    CHECK(first.bytes_sent > 0);
    const auto version1 = weight_bytes(*rollout);
    const auto t = Clock::now();
    std::string error;
    bool timed_out = false;
    try {
      sink.receive();
      FAIL("the sync a training rank was killed in went through");
    } catch (const TimeoutError& e) {
      error = e.what(), timed_out = true;
    } catch (const Error& e) {
      error = e.what();
    }
    const double error_ms = ms_since(t), error_at = monotonic_ms();
    double since_kill_ms = -1;
    if (std::ifstream in(kill_file); in) in >> since_kill_ms, since_kill_ms = error_at - since_kill_ms;
    std::printf("rollout rank %d: %s after %.0f ms (%.0f ms after the kill; sync timeout %lld ms): %s\n", kEnv.rank,
                timed_out ? "timeout" : "error", error_ms, since_kill_ms,
                static_cast<long long>(std::chrono::milliseconds(kSyncTimeout).count()), error.c_str());
    INFO(error);
    CHECK(since_kill_ms >= 0);  // the kill did happen, before the error
    CHECK(error_ms < std::chrono::duration<double, std::milli>(kSyncTimeout).count() + 3000);
    // It names what it waited for: a key of the transfer's agreement (or of the verdicts) in the
    // store (lost while waiting for it, or while reading it once there).
    CHECK_THAT(error, Catch::Contains("waiting for 'shared/sync/killed/") || Catch::Contains("get 'shared/sync/killed/"));
    // The store outlived the training job: the wait ran into the sync's own timeout.
    if (store_on_rollout) {
      CHECK(timed_out);
      CHECK_THAT(error, Catch::Contains("timed out after " + std::to_string(std::chrono::milliseconds(kSyncTimeout).count()) + " ms"));
    }
    CHECK(rollout->weight_version() == 1);
    if (kill_after_transfer) {
      // Bytes of the new version arrived (from both training ranks: balanced), unverified: the
      // engine refuses to generate until a good sync.
      CHECK(weight_bytes(*rollout) != version1);
      CHECK(rollout->weights_torn());
      CHECK_THROWS_WITH(rollout->generate({{1}}, {}), Catch::Contains("last weight sync (in place) failed"));
    } else {
      // The kill came before rank 1's vote: the agreement never completed, no byte moved, and
      // version 1 keeps serving.
      CHECK(weight_bytes(*rollout) == version1);
      CHECK_FALSE(rollout->weights_torn());
    }
    // When this job hosts the store, its rank 0 leaves last.
    if (store_on_rollout) {
      marks->set("done/" + std::to_string(kEnv.rank), "1");
      if (kEnv.rank == 0) {
        std::vector<std::string> done;
        for (int r = 0; r < rollout_size; ++r) done.push_back("done/" + std::to_string(r));
        marks->wait(done, std::chrono::seconds(30));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the last set's reply (above)
      }
    }
  }
}

TEST_CASE("A rollout job that is not up: WeightSender throws a TimeoutError naming it within its timeout",
          "[.sync_rollout_not_up]") {
  constexpr auto kTimeout = std::chrono::seconds(3);
  TrainingSide side(1);
  WeightSyncOptions o;
  o.train_job = kEnv.job;
  o.rollout_job = "syncfail_absent_rollout";
  o.session = "nobody_there";
  o.timeout = kTimeout;
  const auto t = Clock::now();
  std::string error;
  try {
    WeightSender sender(*side.engine, side.config, o);
    FAIL("a WeightSender was built without a rollout job");
  } catch (const TimeoutError& e) {
    error = e.what();
  }
  const double ms = ms_since(t);
  std::printf("training rank %d: TimeoutError after %.0f ms (timeout 3000 ms): %s\n", kEnv.rank, ms, error.c_str());
  INFO(error);
  CHECK_THAT(error, Catch::Contains("weight sync 'nobody_there'") &&
                        Catch::Contains("rollout job 'syncfail_absent_rollout' did not meet within 3000 ms"));
  CHECK(ms >= 3000);
  CHECK(ms < 3000 + 2000);
}
