// Optimizer offload to NVMe (zero_optimization.offload_optimizer.device = "nvme": masters and
// optimizer states in a swap file per rank, io_uring and O_DIRECT) against independent computations,
// run by tessera-launch at 1, 2 and 4 ranks:
//   - the same run without offload: every stored buffer and every loss bitwise equal, at stages
//     1-3, fp32 and bf16, with gradient accumulation, clipping, sub-groups smaller than a partition
//     and several aio settings; nothing of the optimizer in device or host memory but the buffers;
//   - checkpoints saved from the swap file and loaded into it (paged in and written back);
//   - offload_states/reload_states around it (weights and gradients to host memory and back);
//   - a crashed run's leftover swap file is replaced, not trusted; the file goes with the engine;
//   - bad input: nvme_path missing or not a directory (ConfigError naming it), a swap file truncated
//     behind the engine's back (OffloadError naming it, the weights unchanged), a record changed
//     (the step fails part-way naming it; the engine refuses every later step);
//   - a negative control: another weight decay differs.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/offload_test_support.h"
#include "tests/engine/storage_snapshot.h"
#include "tests/engine/test_communicator.h"
#include "transport/communicator.h"

namespace fs = std::filesystem;

namespace {

using namespace tessera::engine_testing;
using namespace tessera::offload_testing;
using tessera::Engine;

Trainee trainee() { return make_trainee(91, 5); }

struct Setup {
  int stage = 2;
  std::string precision;      // a TOML section, empty for fp32
  bool offload = false;
  int buffer_count = 4;       // offload_optimizer.buffer_count
  double weight_decay = 0.01;
  std::string clipping = "gradient_clipping = 0.5\n";
  bool optimizer_section = true;  // false: a client optimizer is given instead
  std::string nvme_path;          // offload_optimizer.nvme_path
  std::string aio;                // an [aio] section
};

std::string config(const Setup& s) {
  const std::string offload = s.offload ? "[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\nnvme_path = \"" +
                                              s.nvme_path + "\"\nbuffer_count = " + std::to_string(s.buffer_count) +
                                              "\n" + s.aio
                                        : "";
  return offload_config(s.stage, s.clipping + s.precision,
                        s.optimizer_section ? std::optional<double>(s.weight_decay) : std::nullopt, offload);
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const Setup& s, const tessera::InitializeOptions& options = {}) {
  return engine_from_toml(t, config(s), "offload_nvme_test", options);
}



tessera::transport::Communicator& test_comm() { return test_communicator("offload_nvme_test"); }

std::string fresh_dir(const std::string& name) { return fresh_shared_dir(test_comm(), "tessera_nvme", name); }

std::string swap_file(const std::string& dir) { return dir + "/tessera_optimizer_rank" + std::to_string(kRank) + ".swap"; }

Setup nvme(Setup s, const std::string& dir, int buffer_count = 4, std::string aio = "") {
  s.offload = true, s.nvme_path = dir, s.buffer_count = buffer_count, s.aio = std::move(aio);
  return s;
}

TEST_CASE("Optimizer offload to NVMe trains bit for bit as the optimizer beside the parameters", "[nvme]") {
  struct Case { int stage; const char* name; std::string precision; int buffer_count; std::string aio; };
  const std::vector<Case> cases = {
      {2, "fp32", "", 4, ""},
      {3, "fp32", "", 3, "[aio]\nblock_size = 4096\nqueue_depth = 2\nintra_op_parallelism = 2\nsingle_submit = true\n"},
      {1, "bf16", kBf16, 4, "[aio]\noverlap_events = false\n"},
      {2, "bf16", kBf16, 5, ""},
      {3, "bf16", kBf16, 4, ""}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", " << c.name << ", buffer_count " << c.buffer_count);
    const auto dir = fresh_dir("train");
    Setup plain{c.stage, c.precision};
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain);
    auto on_nvme = engine_for(b, nvme(plain, dir, c.buffer_count, c.aio));
    CHECK(fs::exists(swap_file(dir)));
    const auto losses_device = train(*on_device, a, 0, 4);
    const auto losses_nvme = train(*on_nvme, b, 0, 4);
    CHECK(losses_device == losses_nvme);
    const auto timing = on_nvme->last_step_timing();
    CHECK(timing.swap.bytes_read > 0);
    CHECK(timing.swap.bytes_written > 0);
    CHECK(timing.swap.prefetched + timing.swap.waited_reads > 0);
    // Where the bytes are: masters and states in the file, only the records' buffers in memory.
    const auto md = on_device->memory(), mn = on_nvme->memory();
    CHECK(mn.parameters == md.parameters);
    CHECK(mn.master == 0);
    CHECK(mn.optimizer_states == 0);
    CHECK(mn.host.master == 0);
    CHECK(mn.host.optimizer_states == 0);
    CHECK(mn.host.swap_buffers > 0);
    CHECK(mn.nvme >= md.optimizer_states);
    CHECK(mn.nvme == int64_t(fs::file_size(swap_file(dir))));
    const auto diff = differing(buffers(*on_device), buffers(*on_nvme));
    INFO(diff.size() << " buffers differ, first " << first(diff));
    CHECK(diff.empty());
    CHECK(on_device->last_grad_norm() == on_nvme->last_grad_norm());
    on_nvme.reset();
    CHECK_FALSE(fs::exists(swap_file(dir)));  // removed with the engine
  }
}

TEST_CASE("Checkpoints move between NVMe-offloaded and on-device optimizers bit for bit", "[nvme][checkpoint]") {
  for (const bool save_offloaded : {true, false}) {
    INFO((save_offloaded ? "saved from NVMe, loaded on the device" : "saved on the device, loaded into NVMe"));
    const auto dir = fresh_dir(save_offloaded ? "ckpt_from" : "ckpt_to");
    const auto swap = fresh_dir(save_offloaded ? "swap_from" : "swap_to");
    Setup plain{3, kBf16};
    const Setup offloaded = nvme(plain, swap);
    const Setup& saver = save_offloaded ? offloaded : plain;
    const Setup& loader = save_offloaded ? plain : offloaded;
    auto whole = trainee();
    auto uninterrupted = engine_for(whole, plain);
    train(*uninterrupted, whole, 0, 4);
    auto part = trainee();
    auto first_half = engine_for(part, saver);
    train(*first_half, part, 0, 2);
    first_half->save_checkpoint(dir);
    first_half.reset();
    auto rest = trainee();
    auto second_half = engine_for(rest, loader);
    second_half->load_checkpoint(dir);
    train(*second_half, rest, 2, 4);
    const auto diff = differing(buffers(*uninterrupted), buffers(*second_half));
    INFO(diff.size() << " buffers differ, first " << first(diff));
    CHECK(diff.empty());
  }
}

TEST_CASE("offload_states and reload_states around an NVMe-offloaded optimizer: unchanged bits", "[nvme][offload_states]") {
  // Colocated RL with the optimizer on NVMe: weights and gradients go to host memory and back; the
  // masters and states stay in the swap file. Training on equals a run that never offloaded.
  const auto dir = fresh_dir("offload_states");
  for (int stage : {2, 3}) {
    INFO("stage " << stage);
    Setup plain{stage, kBf16};
    auto a = trainee(), b = trainee();
    auto reference = engine_for(a, plain);
    auto on_nvme = engine_for(b, nvme(plain, dir));
    train(*reference, a, 0, 2);
    train(*on_nvme, b, 0, 2);
    const auto moved = on_nvme->offload_states();
    CHECK(moved.total() > 0);
    on_nvme->reload_states();
    CHECK(train(*reference, a, 2, 4) == train(*on_nvme, b, 2, 4));
    CHECK(differing(buffers(*reference), buffers(*on_nvme)).empty());
  }
}

TEST_CASE("A crashed run's leftover swap file is replaced, not trusted", "[nvme]") {
  const auto dir = fresh_dir("leftover");
  {
    std::ofstream junk(swap_file(dir), std::ios::binary);
    junk << std::string(1 << 16, '\x7f');
  }
  Setup plain{2, kBf16};
  auto a = trainee(), b = trainee();
  auto on_device = engine_for(a, plain);
  auto on_nvme = engine_for(b, nvme(plain, dir));
  CHECK(train(*on_device, a, 0, 2) == train(*on_nvme, b, 0, 2));
  CHECK(differing(buffers(*on_device), buffers(*on_nvme)).empty());
}

TEST_CASE("Bad NVMe input: a missing path, a file, a truncated swap file", "[nvme]") {
  Setup plain{2, ""};
  const auto dir = fresh_dir("bad");
  SECTION("nvme_path does not exist") {
    auto t = trainee();
    const auto missing = dir + "/no_such_dir";
    CHECK_THROWS_WITH(engine_for(t, nvme(plain, missing)),
                      Catch::Contains("offload_optimizer.nvme_path") && Catch::Contains(missing) && Catch::Contains("No such file"));
  }
  SECTION("nvme_path is a file") {
    auto t = trainee();
    const auto file = dir + "/a_file_" + std::to_string(kRank);
    std::ofstream(file) << "x";
    CHECK_THROWS_WITH(engine_for(t, nvme(plain, file)), Catch::Contains(file) && Catch::Contains("not a directory"));
  }
  SECTION("the swap file is truncated between steps: the step fails naming it, the weights stay") {
    auto t = trainee();
    auto engine = engine_for(t, nvme(plain, dir));
    train(*engine, t, 0, 1);
    const auto before = snapshot_parameters(*t.gpt->module());
    fs::resize_file(swap_file(dir), fs::file_size(swap_file(dir)) / 2);  // every rank its own
    engine->backward(t.loss(1, 0, kRank));
    engine->step();  // micro-step 1 of 2: no update yet
    engine->backward(t.loss(1, 1, kRank));
    CHECK_THROWS_WITH(engine->step(), Catch::Contains(swap_file(dir)) && Catch::Contains("truncated"));
    expect_same_parameters(before, snapshot_parameters(*t.gpt->module()));
  }
  SECTION("the last record is changed between steps: the step fails part-way naming it, and the engine stops") {
    auto t = trainee();
    auto engine = engine_for(t, nvme(plain, dir));
    train(*engine, t, 0, 1);
    // More records than buffers: the last one is read only at its turn, after others were updated
    // (the first ones are read ahead behind the forward, so they would not do).
    const auto memory = engine->memory();
    REQUIRE(memory.nvme > memory.host.swap_buffers);
    {
      std::fstream file(swap_file(dir), std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(-1, std::ios::end);
      const char last = char(file.get());
      file.seekp(-1, std::ios::end);
      file.put(char(last ^ 0x5a));  // every rank its own
    }
    engine->backward(t.loss(1, 0, kRank));
    engine->step();  // micro-step 1 of 2: no update yet
    engine->backward(t.loss(1, 1, kRank));
    CHECK_THROWS_WITH(engine->step(), Catch::Contains(swap_file(dir)) && Catch::Contains("XXH3 differs") &&
                                          Catch::Contains("sub-group"));
    // Part of the optimizer moved on a step and part did not: nothing may go on from that.
    CHECK_THROWS_WITH(engine->backward(t.loss(2, 0, kRank)),
                      Catch::Contains("sub-groups were updated") && Catch::Contains("cannot go on"));
    CHECK_THROWS_WITH(engine->step(), Catch::Contains("cannot go on"));
  }
}

TEST_CASE("Negative control: an NVMe-offloaded run with another weight decay differs", "[nvme]") {
  const auto dir = fresh_dir("control");
  Setup plain{2, ""};
  Setup other = nvme(plain, dir);
  other.weight_decay = 0.02;
  expect_training_differs(trainee, [&](const Trainee& t) { return engine_for(t, plain); },
                          [&](const Trainee& t) { return engine_for(t, other); });
}

}  // namespace
