// Asynchronous checkpoint saves (SaveMode::asynchronous; actors/engine/checkpoint_writer.h): the
// writer snapshots this rank's buffers while the next forward and backward run, and whatever
// changes stored state waits for that snapshot. Against independent computations:
//   - exact resume (save_load_support.h) with the snapshot held back 200 ms, so that the steps
//     after the save run while it is pending: the checkpoint must hold the state of the save,
//     bitwise, at stages 0-3, fp32 and bf16, and with the update during backward;
//   - a write-back (gathered_parameters with a modifier rank) right after the save: the checkpoint
//     holds the weights before it (the oracle: the buffers read at the save);
//   - a parameter changed in place by the user while the snapshot is pending fails the save on
//     every rank naming the parameter, nothing is committed, and the engine goes on;
//   - ranks that disagree on asynchronous saving are refused on every rank before anything is written;
//   - one staging area for many saves, and a failing save raised once on every rank.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "actors/engine/engine.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "tests/engine/save_load_support.h"
#include "tests/engine/storage_snapshot.h"

namespace fs = std::filesystem;

namespace {

using namespace tessera::save_load_testing;

// An asynchronous save whose snapshot waits `hold` on the writer's thread first.
tessera::CheckpointSaveOptions held_async(const std::string& tag, std::chrono::milliseconds hold) {
  tessera::CheckpointSaveOptions options{tag};
  options.mode = tessera::SaveMode::asynchronous;
  options.at_point_for_testing = [hold](tessera::SavePoint p) {
    if (p == tessera::SavePoint::snapshot_begins) std::this_thread::sleep_for(hold);
  };
  return options;
}

// The buffers `engine` loads from `dir`'s tag into a fresh, NaN-filled engine of the same model.
std::map<std::string, at::Tensor> loaded_buffers(const std::string& dir, const std::string& tag, const std::string& toml) {
  auto t = gpt();
  auto engine = engine_for(t, toml);
  fill_nan(*engine);
  engine->load_checkpoint(dir, {tag});
  return buffers(*engine);
}

}  // namespace

TEST_CASE("Asynchronous saves: the state of the save, training goes on meanwhile; the staging area is reused",
          "[resume][async]") {
  for (int stage : {0, 1, 2, 3}) {
    exact_resume("async_fp32_stage" + std::to_string(stage), [] { return gpt(); }, config(stage, ""),
                 tessera::SaveMode::asynchronous);
    if (stage % 2)
      exact_resume("async_bf16_stage" + std::to_string(stage), [] { return gpt(); },
                   config(stage, "[bf16]\nenabled = true\n"), tessera::SaveMode::asynchronous);
  }
  // The config's switch, and one staging area for many saves.
  const auto dir = fresh_dir("async_reuse");
  auto t = gpt();
  auto engine = engine_for(t, config(2, "") + "[tessera.checkpoint]\nasync_save = true\nkeep_last = 1\n");
  int64_t staged = -1;
  for (int step = 0; step < 6; ++step) {
    train(*engine, t, step, step + 1);
    engine->save_checkpoint(dir);
    if (staged < 0) staged = engine->checkpoint_staging_bytes();
    CHECK(engine->checkpoint_staging_bytes() == staged);
  }
  CHECK(staged > 0);
  const auto at_end = buffers(*engine);
  CHECK(engine->load_checkpoint(dir).tag == "global_step6");  // waits for the save in flight
  CHECK(differing(at_end, buffers(*engine)).empty());
}

TEST_CASE("An asynchronous save that fails raises on every rank at the next wait; the engine goes on", "[async]") {
  const auto dir = fresh_dir("async_failure");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  tessera::CheckpointSaveOptions options{"broken"};
  options.mode = tessera::SaveMode::asynchronous;
  options.at_point_for_testing = [](tessera::SavePoint p) {
    if (p == tessera::SavePoint::rank_file_written && kRank == kWorld - 1) throw tessera::Error("disk on fire");
  };
  engine->save_checkpoint(dir, options);
  train(*engine, t, 1, 2);
  CHECK_THROWS_WITH(engine->wait_for_checkpoint(), Catch::Contains("nothing was committed") && Catch::Contains("disk on fire"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "broken"));
  engine->wait_for_checkpoint();  // raised once
  engine->save_checkpoint(dir, {"good"});
  CHECK(engine->load_checkpoint(dir).tag == "good");
}

TEST_CASE("The update during backward waits for the snapshot", "[resume][async]") {
  const std::string offload = "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n"
                              "[tessera.offload]\noptimizer_during_backward = true\n";
  exact_resume("async_during_backward", [] { return gpt(); }, config(3, "") + offload, tessera::SaveMode::asynchronous);
}

TEST_CASE("A write-back right after an asynchronous save reaches the weights, not the checkpoint", "[async]") {
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    const auto dir = fresh_dir("async_writeback_stage" + std::to_string(stage));
    auto t = gpt();
    const auto toml = config(stage, "");
    auto engine = engine_for(t, toml);
    train(*engine, t, 0, 2);
    const auto at_save = buffers(*engine);
    engine->save_checkpoint(dir, held_async("held", std::chrono::milliseconds(200)));
    {
      auto scope = engine->gathered_parameters({}, 0);
      torch::NoGradGuard no_grad;
      if (kRank == 0 || stage < 3)  // below ZeRO-3 the scope writes nothing back: every rank changes its copy
        for (auto& p : t.module->parameters()) p.add_(1.0);
    }
    engine->wait_for_checkpoint();
    CHECK_FALSE(differing(at_save, buffers(*engine)).empty());  // the write-back happened
    const auto diff = differing(at_save, loaded_buffers(dir, "held", toml));
    INFO("buffers that differ from the save's: " << diff.size() << (diff.empty() ? "" : " first " + diff.front()));
    CHECK(diff.empty());
  }
}

TEST_CASE("A parameter changed in place during the snapshot fails the save on every rank, naming it", "[async][errors]") {
  const auto dir = fresh_dir("async_changed");
  auto t = gpt();
  auto engine = engine_for(t, config(1, ""));
  train(*engine, t, 0, 1);
  engine->save_checkpoint(dir, {"good"});
  engine->save_checkpoint(dir, held_async("changed", std::chrono::milliseconds(300)));
  if (kRank == 0) {  // behind the engine's back: no step, no write-back scope
    torch::NoGradGuard no_grad;
    t.module->named_parameters()["lm_head.weight"].mul_(1.0f);
  }
  CHECK_THROWS_WITH(engine->wait_for_checkpoint(),
                    Catch::Contains("parameter 'lm_head.weight' was changed in place") && Catch::Contains("nothing was committed"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "changed"));
  CHECK(tessera::checkpoint::read_latest(dir) == "good");
  train(*engine, t, 1, 2);  // the engine goes on
  engine->save_checkpoint(dir, held_async("after", std::chrono::milliseconds(0)));
  engine->wait_for_checkpoint();
  CHECK(engine->load_checkpoint(dir).tag == "after");
}

TEST_CASE("Ranks that disagree on asynchronous saving are refused on every rank, nothing written", "[async][errors]") {
  if (kWorld < 2) return;  // one rank cannot disagree with itself
  const auto dir = fresh_dir("async_disagree");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  tessera::CheckpointSaveOptions options{"mixed"};
  options.mode = kRank == 1 ? tessera::SaveMode::asynchronous : tessera::SaveMode::synchronous;
  CHECK_THROWS_WITH(engine->save_checkpoint(dir, options),
                    Catch::Contains("rank 1 saves asynchronously, rank 0 synchronously"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "mixed"));
  engine->save_checkpoint(dir, {"agreed"});
  CHECK(engine->load_checkpoint(dir).tag == "agreed");
}
