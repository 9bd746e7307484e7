// Optimizer offload (zero_optimization.offload_optimizer.device = "cpu") against independent
// computations, run by tessera-launch at 1, 2 and 4 ranks:
//   - the same run without offload (the optimizer steps beside the parameters, in place): every
//     stored buffer (weights, masters, each optimizer state) and every loss bitwise equal, at
//     stages 1-3, fp32, bf16 with fp32 masters and bf16 master weights, with gradient accumulation,
//     clipping and sub-groups smaller than a partition (several staging slots in turn);
//   - torch::optim::AdamW on the single-process oracle's averaged gradients (fp32, stage 1);
//   - a client torch::optim optimizer (RMSprop) stepped by its own step() on the host master;
//   - where the bytes are: none of the master or optimizer states on the device, the host's equal
//     to what the run without offload holds on the device;
//   - checkpoints: saved offloaded and loaded without offload, and the other way round, continue
//     bit for bit as one uninterrupted run;
//   - a negative control: an offloaded run with another weight decay differs.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
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
};

std::string config(const Setup& s) {
  const std::string offload =
      s.offload ? "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\npin_memory = true\nbuffer_count = " +
                      std::to_string(s.buffer_count) + "\n"
                : "";
  return offload_config(s.stage, s.clipping + s.precision,
                        s.optimizer_section ? std::optional<double>(s.weight_decay) : std::nullopt, offload);
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const Setup& s, const tessera::InitializeOptions& options = {}) {
  return engine_from_toml(t, config(s), "offload_test", options);
}


TEST_CASE("Optimizer offload trains bit for bit as the optimizer beside the parameters", "[offload]") {
  struct Case { int stage; const char* name; std::string precision; int buffer_count; };
  const std::vector<Case> cases = {{1, "fp32", "", 4}, {2, "fp32", "", 0}, {3, "fp32", "", 2},
                                   {1, "bf16", kBf16, 2}, {2, "bf16", kBf16, 4}, {3, "bf16", kBf16, 4},
                                   {2, "bf16 masters", kBf16Masters, 3}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", " << c.name << ", buffer_count " << c.buffer_count);
    Setup plain{c.stage, c.precision};
    Setup offloaded = plain;
    offloaded.offload = true, offloaded.buffer_count = c.buffer_count;
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain);
    auto on_host = engine_for(b, offloaded);
    const auto losses_device = train(*on_device, a, 0, 4);
    const auto losses_host = train(*on_host, b, 0, 4);
    CHECK(losses_device == losses_host);
    const auto diff = differing(buffers(*on_device), buffers(*on_host));
    INFO(diff.size() << " buffers differ, first " << first(diff));
    CHECK(diff.empty());
    CHECK(on_device->last_grad_norm() == on_host->last_grad_norm());

    // Where the bytes are: the device keeps the weights and gradients, the host the rest.
    const auto md = on_device->memory(), mh = on_host->memory();
    CHECK(mh.parameters == md.parameters);
    CHECK(mh.gradients == md.gradients);
    CHECK(mh.master == 0);
    CHECK(mh.optimizer_states == 0);
    CHECK(md.host.total() == 0);
    CHECK(mh.host.optimizer_states == md.optimizer_states);
    // Without a separate master on the device (fp32, bf16 master weights) the weights are it; the
    // host keeps a copy in their dtype, as large as one of AdamW's two states (in that dtype).
    CHECK(mh.host.master == (md.master > 0 ? md.master : md.optimizer_states / 2));
    CHECK(mh.host.staging > 0);
    const auto timing = on_host->last_step_timing();
    CHECK(timing.offload_copy_s > 0);
    CHECK(on_device->last_step_timing().offload_copy_s == 0);
  }
}

TEST_CASE("A client optimizer (RMSprop) runs offloaded by its own step() on the host master, bit for bit", "[offload]") {
  // Its step() sees the whole partition (one sub-group): the master in host memory, its state beside it.
  auto client = [](torch::nn::Module& m) -> std::shared_ptr<torch::optim::Optimizer> {
    return std::make_shared<torch::optim::RMSprop>(m.parameters(),
                                                   torch::optim::RMSpropOptions(2e-3).alpha(0.95).momentum(0.5));
  };
  for (const std::string precision : {std::string(), std::string(kBf16)}) {
    INFO((precision.empty() ? "fp32" : "bf16"));
    Setup plain{2, precision};
    plain.clipping = "", plain.optimizer_section = false;
    Setup offloaded = plain;
    offloaded.offload = true;
    auto a = trainee(), b = trainee();
    tessera::InitializeOptions oa, ob;
    oa.optimizer = client(*a.gpt->module());
    ob.optimizer = client(*b.gpt->module());
    auto on_device = engine_for(a, plain, oa);
    auto on_host = engine_for(b, offloaded, ob);
    CHECK(train(*on_device, a, 0, 3) == train(*on_host, b, 0, 3));
    const auto diff = differing(buffers(*on_device), buffers(*on_host));
    INFO(diff.size() << " buffers differ, first " << first(diff));
    CHECK(diff.empty());
    CHECK(on_host->memory().master == 0);
  }
}

TEST_CASE("Optimizer offload against torch::optim::AdamW on the averaged gradients", "[offload]") {
  // Stage 1: every rank accumulates its micro-steps locally, then one reduction, as the oracle.
  auto t = trainee();
  auto oracle = trainee();
  Setup s{1, ""};
  s.offload = true, s.clipping = "";
  auto engine = engine_for(t, s);
  auto params = oracle.gpt->module()->parameters();
  torch::optim::AdamW adamw(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.01));
  for (int step = 0; step < 3; ++step) {
    train(*engine, t, step, step + 1);
    average_rank_gradients(params, [&](int rank) {
      // Micro-step 0's gradients into .grad here, micro-step 1's added by the caller's backward;
      // each loss divided by the accumulation steps, as the engine's backward does.
      (oracle.loss(step, 0, rank) / double(kAccumulation)).backward();
      return oracle.loss(step, 1, rank) / double(kAccumulation);
    });
    adamw.step();
  }
  expect_same_parameters(snapshot_parameters(*t.gpt->module()), snapshot_parameters(*oracle.gpt->module()));
}

tessera::transport::Communicator& test_comm() { return test_communicator("offload_test"); }

std::string fresh_dir(const std::string& name) { return fresh_shared_dir(test_comm(), "tessera_offload", name); }

TEST_CASE("Checkpoints move between offloaded and on-device optimizers bit for bit", "[offload][checkpoint]") {
  for (const bool save_offloaded : {true, false}) {
    for (const std::string precision : {std::string(), std::string(kBf16)}) {
      INFO((save_offloaded ? "saved offloaded, loaded on the device" : "saved on the device, loaded offloaded")
           << (precision.empty() ? ", fp32" : ", bf16"));
      const auto dir = fresh_dir(std::string(save_offloaded ? "from_host" : "to_host") + (precision.empty() ? "_fp32" : "_bf16"));
      Setup saver{3, precision}, loader{3, precision};
      (save_offloaded ? saver : loader).offload = true;
      expect_resume_as_uninterrupted(trainee, [&](const Trainee& t) { return engine_for(t, saver); },
                                     [&](const Trainee& t) { return engine_for(t, loader); }, dir);
    }
  }
}

TEST_CASE("Negative control: an offloaded run with another weight decay differs", "[offload]") {
  Setup plain{2, ""};
  Setup other = plain;
  other.offload = true, other.weight_decay = 0.02;
  expect_training_differs(trainee, [&](const Trainee& t) { return engine_for(t, plain); },
                          [&](const Trainee& t) { return engine_for(t, other); });
}

}  // namespace
