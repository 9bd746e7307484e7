// Checkpoints (Engine::save_checkpoint / load_checkpoint) against independent computations:
//   - exact resume: train 3 steps, save, train 2 more; a second engine whose every buffer is NaN
//     loads the checkpoint, must hold the saved buffers bitwise, and its 2 steps must end on the
//     first engine's buffers and counters bitwise (stages 0-3; fp32, bf16, fp16 with a skipped step;
//     gradient accumulation 2). A negative control shows the comparison sees a buffer left NaN.
//   - bad checkpoints (a flipped byte, a truncated or missing file, another model's checkpoint, a
//     directory that is no checkpoint) are refused on every rank naming the file or tensor, and
//     nothing changes.
//   - [.layout_save] / [.layout_load] (save_load_layouts.py): saved at one data-parallel size and
//     stage, loaded at others; every stored tensor, read element by element through each side's
//     maps from all ranks' buffers (not through the planner), equals the saved one bitwise, and the
//     weights equal the saved ones through gathered parameters too.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/io/safetensors.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/save_load_support.h"
#include "tests/engine/storage_snapshot.h"
#include "tests/engine/test_communicator.h"
#include "transport/communicator.h"

namespace fs = std::filesystem;

namespace {

using namespace tessera::save_load_testing;

}  // namespace

TEST_CASE("Exact resume: a NaN-filled engine loads the checkpoint and continues bit for bit", "[resume]") {
  for (int stage : {0, 1, 2, 3}) {
    exact_resume("fp32_stage" + std::to_string(stage), [] { return gpt(); }, config(stage, ""));
    exact_resume("bf16_stage" + std::to_string(stage), [] { return gpt(); }, config(stage, "[bf16]\nenabled = true\n"));
  }
  // fp16: the loss scaler's state and a skipped step (step 1 overflows on rank 0).
  for (int stage : {1, 2})
    exact_resume("fp16_stage" + std::to_string(stage), mlp,
                 config(stage, "[fp16]\nenabled = true\ninitial_scale_power = 10\nloss_scale_window = 2\nhysteresis = 1\n"));
}

TEST_CASE("A bad checkpoint is refused on every rank, naming the file or tensor, and nothing changes", "[errors]") {
  const auto dir = fresh_dir("errors");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  engine->save_checkpoint(dir, {"good"});
  train(*engine, t, 1, 2);
  const auto before = buffers(*engine);
  const auto counters_before = counters(*engine);
  const auto file0 = (fs::path(dir) / "good" / "rank0.safetensors").string();
  auto unchanged = [&] {
    CHECK(differing(before, buffers(*engine)).empty());
    CHECK(counters(*engine) == counters_before);
  };
  auto refused = [&](const std::string& what, const std::string& expect, const std::function<void()>& load) {
    INFO(what);
    try {
      load();
      FAIL("loaded " << what);
    } catch (const CheckpointError& e) {
      CHECK_THAT(e.what(), Catch::Contains(expect));
      CHECK_THAT(e.what(), Catch::Contains("nothing was loaded"));
    }
    unchanged();
    barrier();
  };
  auto load_good = [&] { engine->load_checkpoint(dir, {"good"}); };
  {  // one flipped byte inside the weights
    const auto size = fs::file_size(file0);
    char byte = 0;
    if (kRank == 0) {
      std::fstream f(file0, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(std::streamoff(size - 100));
      f.read(&byte, 1);
      f.seekp(std::streamoff(size - 100));
      const char flipped = char(byte ^ 0x10);
      f.write(&flipped, 1);
    }
    barrier();
    refused("a flipped byte", "do not match their hash", load_good);
    if (kRank == 0) {
      std::fstream f(file0, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(std::streamoff(size - 100));
      f.write(&byte, 1);
    }
    barrier();
  }
  {  // truncated, then missing
    if (kRank == 0) fs::copy_file(file0, file0 + ".keep");
    if (kRank == 0) fs::resize_file(file0, fs::file_size(file0) - 1);
    barrier();
    refused("a truncated file", "truncated or replaced", load_good);
    if (kRank == 0) fs::remove(file0);
    barrier();
    refused("a missing file", "rank0.safetensors: missing", load_good);
    if (kRank == 0) fs::rename(file0 + ".keep", file0);
    barrier();
  }
  refused("a directory without checkpoints", "no 'latest' file", [&] { engine->load_checkpoint(dir + "/nothing_here"); });
  refused("an unknown tag", "not a committed checkpoint", [&] { engine->load_checkpoint(dir, {"no_such_tag"}); });
  {  // another model's checkpoint
    const auto other_dir = fresh_dir("errors_other_model");
    auto other = mlp();
    auto other_engine = engine_for(other, config(2, ""));
    other_engine->save_checkpoint(other_dir);
    refused("another model's checkpoint", "trainable parameters", [&] { engine->load_checkpoint(other_dir); });
  }
  {  // the same model in bf16: the dtypes are named
    const auto bf16_dir = fresh_dir("errors_bf16");
    auto same = gpt();
    auto bf16_engine = engine_for(same, config(2, "[bf16]\nenabled = true\n"));
    bf16_engine->save_checkpoint(bf16_dir);
    refused("a bf16 checkpoint into fp32", "is bf16", [&] { engine->load_checkpoint(bf16_dir); });
  }
  // And the good one still loads: the state of the save.
  engine->load_checkpoint(dir, {"good"});
  CHECK(engine->global_steps() == 1);
}

// A full disk on one rank, as RLIMIT_FSIZE makes it (writes past the limit fail with EFBIG once
// SIGXFSZ is ignored): every rank raises, nothing is committed or left behind, the last checkpoint
// still loads and the engine trains and saves on.
TEST_CASE("A save that runs out of space on one rank commits nothing and leaves the engine usable", "[errors]") {
  const auto dir = fresh_dir("full_disk");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  engine->save_checkpoint(dir, {"before"});
  train(*engine, t, 1, 2);
  const bool limited = kRank == kWorld - 1;
  struct rlimit old_limit;
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  if (limited) {
    struct rlimit small = old_limit;
    small.rlim_cur = 64 << 10;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  }
  try {
    engine->save_checkpoint(dir, {"full"});
    FAIL("a save past the disk's space was committed");
  } catch (const CheckpointError& e) {
    CHECK_THAT(e.what(), Catch::Contains("nothing was committed") && Catch::Contains("rank" + std::to_string(kWorld - 1) + ".safetensors"));
  }
  if (limited) ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  barrier();
  CHECK_FALSE(fs::exists(fs::path(dir) / "full"));
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
  CHECK(engine->load_checkpoint(dir).tag == "before");
  train(*engine, t, 1, 2);
  engine->save_checkpoint(dir, {"after"});
  CHECK(engine->load_checkpoint(dir).tag == "after");
}

TEST_CASE("Save inside a batch is refused; a bad tag is refused", "[errors]") {
  const auto dir = fresh_dir("inside_batch");
  auto t = gpt();
  auto engine = engine_for(t, config(1, ""));
  engine->backward(t.loss(0, 0));
  engine->step();  // micro-step 1 of 2
  CHECK_THROWS_WITH(engine->save_checkpoint(dir), Catch::Contains("inside a batch"));
  engine->backward(t.loss(0, 1));
  engine->step();
  CHECK_THROWS_WITH(engine->save_checkpoint(dir, {"../escape"}), Catch::Contains("not a plain directory name"));
  CHECK_THROWS_WITH(engine->save_checkpoint(dir, {"x", "[1, 2]"}), Catch::Contains("must be a JSON object"));
  engine->save_checkpoint(dir, {"ok"});
  CHECK(fs::exists(fs::path(dir) / "ok" / "manifest.json"));
}

// DeepSpeed's `checkpoint.tag_validation` when the ranks pass different tags: Fail refuses on
// every rank before anything is written; Warn (the default) and Ignore save under rank 0's tag.
TEST_CASE("checkpoint.tag_validation: ranks passing different tags", "[errors]") {
  if (kWorld == 1) return;  // one rank cannot disagree with itself
  const std::string mine = "step_rank" + std::to_string(kRank);
  auto t = gpt();
  {
    const auto dir = fresh_dir("tags_fail");
    auto engine = engine_for(t, config(1, "") + "[checkpoint]\ntag_validation = \"FAIL\"\n");
    train(*engine, t, 0, 1);
    CHECK_THROWS_WITH(engine->save_checkpoint(dir, {mine}),
                      Catch::Contains("different tags") && Catch::Contains("rank 0 'step_rank0'") &&
                          Catch::Contains("rank 1 'step_rank1'") && Catch::Contains("Fail"));
    barrier();
    CHECK(fs::is_empty(dir));  // no tag directory, no partial one, no latest
    engine->save_checkpoint(dir, {"agreed"});  // the engine goes on
    CHECK(engine->load_checkpoint(dir).tag == "agreed");
  }
  for (const std::string mode : {"Warn", "ignore"}) {
    INFO(mode);
    const auto dir = fresh_dir("tags_" + mode);
    auto engine = engine_for(t, config(1, "") + "[checkpoint]\ntag_validation = \"" + mode + "\"\n");
    train(*engine, t, 0, 1);
    const auto path = engine->save_checkpoint(dir, {mine});
    CHECK(path == (fs::path(dir) / "step_rank0").string());
    barrier();
    CHECK(fs::exists(fs::path(dir) / "step_rank0" / "manifest.json"));
    CHECK_FALSE(fs::exists(fs::path(dir) / "step_rank1"));
    CHECK(engine->load_checkpoint(dir).tag == "step_rank0");
  }
}

// Saved at this launch's layout (TESSERA_CKPT_STAGE, TESSERA_CKPT_DTYPE) into TESSERA_CKPT_DIR,
// with the reference every later layout must reproduce (reference.safetensors, rank 0).
TEST_CASE("Save at one layout, with its reference", "[.layout_save]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  REQUIRE(!dir.empty());
  const int stage = std::stoi(env_string("TESSERA_CKPT_STAGE", "0"));
  auto t = gpt();
  auto engine = engine_for(t, config(stage, precision_section(env_string("TESSERA_CKPT_DTYPE", "fp32"))));
  train(*engine, t, 0, 3);
  engine->save_checkpoint(dir);
  auto reference = materialize(*engine);
  for (auto& [name, w] : gathered_weights(*engine)) reference[name] = w;
  if (kRank == 0) {
    std::vector<std::pair<std::string, at::Tensor>> tensors(reference.begin(), reference.end());
    tessera::io::write_safetensors(dir + "/reference.safetensors", tensors);
  }
  barrier();
}

TEST_CASE("Load at another layout: every stored tensor bitwise", "[.layout_load]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  REQUIRE(!dir.empty());
  const int stage = std::stoi(env_string("TESSERA_CKPT_STAGE", "0"));
  auto t = gpt(123);  // another initialisation: everything must come from the checkpoint
  auto engine = engine_for(t, config(stage, precision_section(env_string("TESSERA_CKPT_DTYPE", "fp32"))));
  fill_nan(*engine);
  engine->load_checkpoint(dir);
  CHECK(engine->global_steps() == 3);
  const tessera::io::SafetensorsFile reference(dir + "/reference.safetensors");
  auto mine = materialize(*engine);
  for (auto& [name, w] : gathered_weights(*engine)) mine[name] = w;
  int compared = 0;
  for (const auto& [name, tensor] : mine) {
    INFO(name);
    REQUIRE(reference.contains(name));  // the same kinds at every layout of one precision
    CHECK(torch::equal(reference.read(name).view(torch::kByte), tensor.view(torch::kByte)));
    ++compared;
  }
  CHECK(compared == int(reference.header().tensors.size()));
  // Training goes on from there.
  train(*engine, t, 3, 4);
  CHECK(engine->global_steps() == 4);
  for (const auto& [name, w] : gathered_weights(*engine)) CHECK(torch::isfinite(w).all().item<bool>());
}

// kill -9 of one rank at TESSERA_KILL_POINT of the second save (save_load_kill.py): the launcher
// then ends the others. [.kill_check] (fresh processes) must find the first checkpoint intact, or
// the second one whole where the kill came after its commit.
TEST_CASE("A save killed at a given point", "[.kill_save]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", ""), point = env_string("TESSERA_KILL_POINT", "");
  const int kill_rank = std::stoi(env_string("TESSERA_KILL_RANK", "0"));
  REQUIRE(!dir.empty());
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  engine->save_checkpoint(dir, {"first"});
  train(*engine, t, 1, 2);
  tessera::CheckpointSaveOptions options{"second"};
  if (env_string("TESSERA_KILL_ASYNC", "0") == "1") options.mode = tessera::SaveMode::asynchronous;
  options.at_point_for_testing = [&](tessera::SavePoint p) {
    static const std::map<std::string, tessera::SavePoint> points{
        {"snapshot_begins", tessera::SavePoint::snapshot_begins},
        {"rank_file_written", tessera::SavePoint::rank_file_written},
        {"manifest_written", tessera::SavePoint::manifest_written},
        {"committed", tessera::SavePoint::committed},
        {"latest_written", tessera::SavePoint::latest_written}};
    if (kRank == kill_rank && points.at(point) == p) ::kill(::getpid(), SIGKILL);
  };
  engine->save_checkpoint(dir, options);
  train(*engine, t, 2, 3);  // an asynchronous save is killed on the writer's thread meanwhile
  engine->wait_for_checkpoint();
  FAIL("rank " << kRank << " returned from the save it was to be killed in");
}

TEST_CASE("After a killed save", "[.kill_check]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", ""), point = env_string("TESSERA_KILL_POINT", "");
  REQUIRE(!dir.empty());
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  const auto loaded = engine->load_checkpoint(dir);
  const bool second_is_latest = point == "latest_written";
  CHECK(loaded.tag == (second_is_latest ? "second" : "first"));
  CHECK(engine->global_steps() == (second_is_latest ? 2 : 1));
  const bool second_committed = point == "committed" || point == "latest_written";
  CHECK(fs::exists(fs::path(dir) / "second" / "manifest.json") == second_committed);
  if (second_committed) {  // whole: it loads by its tag
    engine->load_checkpoint(dir, {"second"});
    CHECK(engine->global_steps() == 2);
  }
  // The next save clears what the killed one left, and commits.
  train(*engine, t, 2, 3);
  engine->save_checkpoint(dir, {"third"});
  barrier();
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
  CHECK(engine->load_checkpoint(dir).tag == "third");
}

TEST_CASE("[tessera.checkpoint] keep_last = 2 keeps the two newest tags", "[keep]") {
  const auto dir = fresh_dir("keep_last");
  auto t = gpt();
  auto engine = engine_for(t, config(1, "") + "[tessera.checkpoint]\nkeep_last = 2\n");
  for (int step = 0; step < 4; ++step) {
    train(*engine, t, step, step + 1);
    engine->save_checkpoint(dir);
  }
  barrier();
  std::vector<std::string> tags;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.is_directory()) tags.push_back(entry.path().filename().string());
  std::sort(tags.begin(), tags.end());
  CHECK(tags == std::vector<std::string>{"global_step3", "global_step4"});
  CHECK(engine->load_checkpoint(dir).tag == "global_step4");
}

// Preemption (save_load_sigterm.py): the job trains until SIGTERM reaches the launcher, which
// forwards it; every rank saves at the next step boundary and exits 0.
TEST_CASE("Trains until SIGTERM, then saves", "[.sigterm]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  REQUIRE(!dir.empty());
  auto t = gpt();
  auto engine = engine_for(t, config(2, "") + "[tessera.checkpoint]\nsigterm_save_dir = \"" + dir + "\"\n");
  for (int step = 0; step < 100000; ++step) {
    train(*engine, t, step, step + 1);
    if (step == 2 && kRank == 0) std::ofstream(dir + "/.ready") << "3\n";  // the driver may signal now
  }
  FAIL("trained 100000 steps without a SIGTERM");
}

TEST_CASE("The checkpoint SIGTERM left", "[.sigterm_check]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  const auto loaded = engine->load_checkpoint(dir);
  CHECK(engine->global_steps() >= 3);
  CHECK(loaded.tag == "global_step" + std::to_string(engine->global_steps()));
  train(*engine, t, int(engine->global_steps()), int(engine->global_steps()) + 1);
}

// The stress script (tools/checkpoint_kill_stress.py) kills this job at random moments: it saves
// after every step, forever, keeping the newest two tags.
TEST_CASE("Saves after every step until killed", "[.stress_save]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  REQUIRE(!dir.empty());
  const bool async = env_string("TESSERA_STRESS_ASYNC", "0") == "1";
  auto t = gpt();
  auto engine = engine_for(t, config(2, "") + "[tessera.checkpoint]\nkeep_last = 2\n");
  int step = 0;
  try {
    engine->load_checkpoint(dir);  // a later run goes on from the latest
    step = int(engine->global_steps());
  } catch (const CheckpointError&) {  // the first run: nothing saved yet
  }
  for (;; ++step) {
    train(*engine, t, step, step + 1);
    tessera::CheckpointSaveOptions options;
    options.mode = async ? tessera::SaveMode::asynchronous : tessera::SaveMode::synchronous;
    engine->save_checkpoint(dir, options);
  }
}

TEST_CASE("The latest checkpoint loads after a kill", "[.stress_check]") {
  const std::string dir = env_string("TESSERA_CKPT_DIR", "");
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  const auto loaded = engine->load_checkpoint(dir);
  CHECK(loaded.tag == "global_step" + std::to_string(engine->global_steps()));
  if (kRank == 0) std::printf("loaded %s\n", loaded.tag.c_str());
}

TEST_CASE("load_optimizer_states = false: the weights, masters from them, states kept; load_module_only: counters kept",
          "[partial_load]") {
  const auto dir = fresh_dir("partial_load");
  const auto toml = config(2, "[bf16]\nenabled = true\n");
  auto t = gpt();
  auto saved = engine_for(t, toml);
  train(*saved, t, 0, 3);
  saved->save_checkpoint(dir);
  const auto at_save = buffers(*saved);
  auto other = gpt(123);
  auto engine = engine_for(other, toml);
  train(*engine, other, 0, 1);
  const auto before = buffers(*engine);
  tessera::CheckpointLoadOptions weights_only;
  weights_only.load_optimizer_states = false;
  engine->load_checkpoint(dir, weights_only);
  auto now = buffers(*engine);
  CHECK(torch::equal(now.at("param/0"), at_save.at("param/0")));
  CHECK(torch::equal(now.at("exp_avg/0"), before.at("exp_avg/0")));  // this engine's own states
  CHECK_FALSE(torch::equal(now.at("exp_avg/0"), at_save.at("exp_avg/0")));
  // The fp32 masters are the loaded bf16 weights (this rank's partition of them, where mapped).
  const auto storage = engine->storage_maps();
  for (const auto& m : storage.maps) {
    if (m.kind != "master") continue;
    const auto mine = m.map.ranks.find(kRank);
    if (mine == m.map.ranks.end()) continue;
    for (const auto& piece : mine->second.pieces) {
      const auto n = piece.box.volume();
      if (n == 0) continue;
      auto master = now.at("master/0").narrow(0, piece.offset, n);
      CHECK(torch::equal(master, master.to(torch::kBFloat16).to(torch::kFloat)));  // exactly representable
    }
  }
  CHECK(engine->global_steps() == 3);  // the counters come with the weights
  tessera::CheckpointLoadOptions module_only;
  module_only.load_module_only = true;
  auto third = gpt(5);
  auto fresh = engine_for(third, toml);
  train(*fresh, third, 0, 1);
  fresh->load_checkpoint(dir, module_only);
  CHECK(torch::equal(buffers(*fresh).at("param/0"), at_save.at("param/0")));
  CHECK(fresh->global_steps() == 1);  // untouched
}

TEST_CASE("load_lr_scheduler_states = false: the scheduler keeps its own position; true: the checkpoint's",
          "[partial_load]") {
  const auto dir = fresh_dir("scheduler_states");
  const auto toml = config(1, "");  // WarmupLR over 4 steps: the lr says where the schedule is
  auto t = gpt();
  auto saved = engine_for(t, toml);
  train(*saved, t, 0, 3);
  saved->save_checkpoint(dir);
  const auto saved_position = saved->last_batch_iteration();
  const auto saved_lr = saved->get_lr();
  auto other = gpt(9);
  auto engine = engine_for(other, toml);
  train(*engine, other, 0, 1);
  const auto own_position = engine->last_batch_iteration();
  const auto own_lr = engine->get_lr();
  REQUIRE(own_position != saved_position);  // control: the two positions (and lrs) can be told apart
  REQUIRE(own_lr != saved_lr);
  tessera::CheckpointLoadOptions keep_schedule;
  keep_schedule.load_lr_scheduler_states = false;
  engine->load_checkpoint(dir, keep_schedule);
  CHECK(engine->global_steps() == 3);
  CHECK(engine->last_batch_iteration() == own_position);
  CHECK(engine->get_lr() == own_lr);
  auto third = gpt(10);
  auto fresh = engine_for(third, toml);
  train(*fresh, third, 0, 1);
  fresh->load_checkpoint(dir);  // the default: the checkpoint's position
  CHECK(fresh->last_batch_iteration() == saved_position);
  CHECK(fresh->get_lr() == saved_lr);
}

TEST_CASE("A client optimizer tessera does not translate: save and load refused naming its class", "[errors]") {
  const auto dir = fresh_dir("client_optimizer");
  auto t = gpt();
  const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(kGlobalBatch / kWorld) +
                           "\ngradient_accumulation_steps = 2\n[zero_optimization]\nstage = 1\n";
  tessera::InitializeOptions options;
  options.optimizer = std::make_shared<torch::optim::RMSprop>(t.module->parameters(), torch::optim::RMSpropOptions(1e-3));
  auto engine =
      tessera::initialize(t.module, tessera::config::load_config_text(toml, tessera::config::Format::toml, "client"), options)
          .engine;
  train(*engine, t, 0, 1);
  CHECK_THROWS_AS(engine->save_checkpoint(dir), CheckpointError);
  CHECK_THROWS_WITH(engine->save_checkpoint(dir), Catch::Contains("torch::optim::RMSprop"));
  CHECK_FALSE(fs::exists(fs::path(dir) / "latest"));
  CHECK_THROWS_WITH(engine->load_checkpoint(dir), Catch::Contains("torch::optim::RMSprop"));
}

// Run by save_load_full_disk.py inside a mount namespace whose TESSERA_CKPT_DIR is a small tmpfs:
// the first checkpoint fits; rank 0 then fills the disk so that only half of another fits, and the
// next save runs out of space (ENOSPC, on whichever ranks it hits): nothing is committed, no partial
// directory is left, the first still loads, and once space is freed the engine saves again.
TEST_CASE("A save onto a full tmpfs commits nothing and leaves the engine usable", "[.tmpfs_full]") {
  const fs::path dir = env_string("TESSERA_CKPT_DIR", "");
  REQUIRE_FALSE(dir.empty());
  auto t = gpt();
  auto engine = engine_for(t, config(2, ""));
  train(*engine, t, 0, 1);
  engine->save_checkpoint(dir.string(), {"fits"});
  const auto at_save = buffers(*engine);
  int64_t checkpoint_bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir / "fits"))
    if (entry.is_regular_file()) checkpoint_bytes += int64_t(entry.file_size());
  const auto filler = dir / "filler";
  if (kRank == 0) {
    const auto space = fs::space(dir);
    const int64_t keep = checkpoint_bytes / 2;
    std::ofstream(filler, std::ios::binary) << std::string(size_t(std::max<int64_t>(0, int64_t(space.available) - keep)), 'x');
    INFO("tmpfs: " << fs::space(dir).available << " bytes left for a " << checkpoint_bytes << "-byte checkpoint");
    REQUIRE(int64_t(fs::space(dir).available) < checkpoint_bytes);
  }
  barrier();
  train(*engine, t, 1, 2);
  try {
    engine->save_checkpoint(dir.string(), {"full"});
    FAIL("a save onto a full disk was committed");
  } catch (const CheckpointError& e) {
    CHECK_THAT(e.what(), Catch::Contains("nothing was committed") && Catch::Contains("space"));
  }
  barrier();
  CHECK_FALSE(fs::exists(dir / "full"));
  for (const auto& entry : fs::directory_iterator(dir))
    CHECK(entry.path().filename().string().find(".partial-") == std::string::npos);
  auto second = gpt(31);
  auto fresh = engine_for(second, config(2, ""));
  fill_nan(*fresh);
  CHECK(fresh->load_checkpoint(dir.string()).tag == "fits");
  CHECK(differing(at_save, buffers(*fresh)).empty());
  if (kRank == 0) fs::remove(filler);
  barrier();
  train(*engine, t, 2, 3);
  engine->save_checkpoint(dir.string(), {"after"});
  CHECK(engine->load_checkpoint(dir.string()).tag == "after");
}
