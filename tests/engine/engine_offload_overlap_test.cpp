// The offloaded optimizer updating during backward (tessera.offload.optimizer_during_backward)
// against independent computations, run by tessera-launch at 1, 2 and 4 ranks:
//   - the same training without offload and with offload updating in step(): every stored buffer
//     and every loss bitwise equal, stages 2 (across ranks) and 3, fp32 and bf16 with fp32
//     masters, gradient accumulation, sub-groups smaller than a partition, the states in host memory
//     and on NVMe, the parameters' partitions on NVMe;
//   - that the updates really ran before step(): with a pause between backward and step(), most
//     sub-groups were final (and updated) before step() began;
//   - refusals naming the key (clipping, fp16, no offload, stage 1, stage 2 on one rank), a
//     second backward in the boundary micro-step and zero_grad() after the update began;
//   - a negative control: an overlapped run with another weight decay differs.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <thread>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/offload_test_support.h"
#include "tests/engine/storage_snapshot.h"

namespace {

using namespace tessera::engine_testing;
using namespace tessera::offload_testing;
using tessera::Engine;

Trainee trainee() { return make_trainee(93, 7); }

enum class Offload { none, in_step, during_backward };

struct Setup {
  int stage = 2;
  std::string precision;  // a TOML section, empty for fp32
  Offload offload = Offload::none;
  double weight_decay = 0.01;
  std::string extra;  // more top-level keys
  std::string nvme_path;  // the optimizer's states on NVMe (else in host memory)
  std::string parameter_nvme_path;  // stage 3: the parameters' partitions on NVMe too
};

std::string config(const Setup& s) {
  std::string offload;
  if (s.offload != Offload::none)
    offload += s.nvme_path.empty() ? std::string("[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n")
                                   : "[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\nnvme_path = \"" + s.nvme_path + "\"\n";
  if (!s.parameter_nvme_path.empty())
    offload += "[zero_optimization.offload_param]\ndevice = \"nvme\"\nnvme_path = \"" + s.parameter_nvme_path +
               "\"\nbuffer_size = 2048\nbuffer_count = 3\n";
  if (s.offload == Offload::during_backward) offload += "[tessera.offload]\noptimizer_during_backward = true\n";
  return offload_config(s.stage, s.extra + s.precision, s.weight_decay, offload);
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const Setup& s) {
  return engine_from_toml(t, config(s), "overlap_test");
}

struct Trained {
  std::vector<double> losses;
  int64_t updated_before_step = 0;
};

// `pause`: between the boundary backward and step(), so that the updates can run before step().
Trained train(Engine& engine, const Trainee& t, int steps, std::chrono::milliseconds pause = {}) {
  Trained out;
  for (int step = 0; step < steps; ++step)
    for (int micro = 0; micro < kAccumulation; ++micro) {
      auto loss = t.loss(step, micro, kRank);
      engine.backward(loss);
      if (micro + 1 == kAccumulation && pause.count() > 0) std::this_thread::sleep_for(pause);
      engine.step();
      out.losses.push_back(loss.item<double>());
      if (micro + 1 == kAccumulation) out.updated_before_step += engine.last_step_timing().updated_before_step;
    }
  return out;
}

bool overlap_runs_here(int stage) { return stage == 3 || kWorld > 1; }

TEST_CASE("Updating during backward trains bit for bit as without offload and as updating in step()", "[overlap]") {
  enum class Nvme { none, states, states_and_parameters, parameters };
  struct Case { int stage; const char* name; std::string precision; Nvme nvme; };
  const std::vector<Case> cases = {{2, "fp32", "", Nvme::none}, {2, "bf16", kBf16, Nvme::none}, {3, "fp32", "", Nvme::none},
                                   {3, "bf16", kBf16, Nvme::none}, {2, "bf16, states on NVMe", kBf16, Nvme::states},
                                   {3, "fp32, states on NVMe", "", Nvme::states},
                                   {3, "bf16, states and parameters on NVMe", kBf16, Nvme::states_and_parameters},
                                   {3, "fp32, parameters on NVMe", "", Nvme::parameters}};
  for (const auto& c : cases) {
    if (!overlap_runs_here(c.stage)) continue;  // refused (below)
    INFO("stage " << c.stage << ", " << c.name);
    Setup plain{c.stage, c.precision};
    Setup in_step = plain, overlapped = plain;
    in_step.offload = Offload::in_step;
    overlapped.offload = Offload::during_backward;
    auto dir = [&](const std::string& run) {
      return fresh_shared_dir(test_communicator("overlap_test"), "tessera_overlap", run + "_" + std::to_string(&c - cases.data()));
    };
    if (c.nvme == Nvme::states || c.nvme == Nvme::states_and_parameters)
      in_step.nvme_path = dir("in_step"), overlapped.nvme_path = dir("overlapped");
    if (c.nvme == Nvme::parameters || c.nvme == Nvme::states_and_parameters)
      in_step.parameter_nvme_path = dir("in_step_params"), overlapped.parameter_nvme_path = dir("overlapped_params");
    auto a = trainee(), b = trainee(), o = trainee();
    auto e_plain = engine_for(a, plain);
    auto e_in_step = engine_for(b, in_step);
    auto e_overlapped = engine_for(o, overlapped);
    const auto l_plain = train(*e_plain, a, 4).losses;
    const auto l_in_step = train(*e_in_step, b, 4).losses;
    const auto overlap = train(*e_overlapped, o, 4);
    CHECK(l_plain == overlap.losses);
    CHECK(l_in_step == overlap.losses);
    auto diff = differing(buffers(*e_plain), buffers(*e_overlapped));
    INFO(diff.size() << " buffers differ from the run without offload, first " << first(diff));
    CHECK(diff.empty());
    diff = differing(buffers(*e_in_step), buffers(*e_overlapped));
    INFO(diff.size() << " buffers differ from offload updating in step(), first " << first(diff));
    CHECK(diff.empty());
    CHECK(e_in_step->last_step_timing().updated_before_step == 0);
  }
}

TEST_CASE("With a pause before step(), the sub-groups are updated before step() begins", "[overlap]") {
  // Every reduction finishes within the pause, so every sub-group is final before step(); the
  // optimizer-shard updates them then. Still bit for bit the run updating in step().
  const int stage = kWorld > 1 ? 2 : 3;
  Setup in_step{stage, kBf16}, overlapped{stage, kBf16};
  in_step.offload = Offload::in_step, overlapped.offload = Offload::during_backward;
  auto a = trainee(), o = trainee();
  auto e_in_step = engine_for(a, in_step);
  auto e_overlapped = engine_for(o, overlapped);
  train(*e_in_step, a, 3);
  const auto run = train(*e_overlapped, o, 3, std::chrono::milliseconds(300));
  CHECK(differing(buffers(*e_in_step), buffers(*e_overlapped)).empty());
  // Stage 3's sub-groups holding persistent pieces are final only at the end of backward, but
  // still before step(); across 3 steps nearly every sub-group of every step.
  INFO("sub-groups updated before step() over 3 steps: " << run.updated_before_step);
  CHECK(run.updated_before_step > 0);
}

void expect_refused(const Setup& s, const std::string& words) {
  tessera::offload_testing::expect_refused(trainee(), config(s), "tessera.offload.optimizer_during_backward", words);
}

TEST_CASE("Updating during backward is refused where an update needs every gradient first", "[overlap]") {
  Setup s{2, ""};
  s.offload = Offload::during_backward;
  SECTION("clipping") {
    s.extra = "gradient_clipping = 0.5\n";
    if (kWorld == 1) s.stage = 3;
    expect_refused(s, "gradient_clipping");
  }
  SECTION("fp16") {
    s.precision = "[fp16]\nenabled = true\n";
    s.stage = 3;
    expect_refused(s, "fp16");
  }
  SECTION("stage 1") {
    s.stage = 1;
    expect_refused(s, "stage 2 or 3");
  }
  SECTION("no optimizer offload") {
    auto text = config(s);
    const auto at = text.find("[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n");
    text.erase(at, std::string("[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n").size());
    auto t = trainee();
    CHECK_THROWS_WITH(tessera::initialize(t.gpt->module(),
                                          tessera::config::load_config_text(text, tessera::config::Format::toml, "overlap_test")),
                      Catch::Contains("needs zero_optimization.offload_optimizer.device = \"cpu\" (or \"nvme\")"));
  }
  SECTION("stage 2 on one rank") {
    if (kWorld == 1) expect_refused(s, "one rank");
  }
}

TEST_CASE("A second backward at the boundary and zero_grad() after the update began are refused", "[overlap]") {
  Setup s{kWorld > 1 ? 2 : 3, kBf16};
  s.offload = Offload::during_backward;
  auto t = trainee(), oracle = trainee();
  auto engine = engine_for(t, s);
  Setup in_step = s;
  in_step.offload = Offload::in_step;
  auto reference = engine_for(oracle, in_step);
  engine->backward(t.loss(0, 0, kRank));
  engine->step();
  engine->backward(t.loss(0, 1, kRank));
  CHECK_THROWS_WITH(engine->backward(t.loss(0, 1, kRank)), Catch::Contains("called twice"));
  CHECK_THROWS_WITH(engine->zero_grad(), Catch::Contains("call step() to finish it"));
  engine->step();  // the refused calls changed nothing
  train(*reference, oracle, 1);
  CHECK(differing(buffers(*reference), buffers(*engine)).empty());
}

TEST_CASE("Negative control: an overlapped run with another weight decay differs", "[overlap]") {
  Setup plain{3, ""};
  Setup other = plain;
  other.offload = Offload::during_backward, other.weight_decay = 0.02;
  auto a = trainee(), b = trainee();
  auto e_plain = engine_for(a, plain);
  auto e_other = engine_for(b, other);
  train(*e_plain, a, 2);
  train(*e_other, b, 2);
  CHECK_FALSE(differing(buffers(*e_plain), buffers(*e_other)).empty());
}

}  // namespace
