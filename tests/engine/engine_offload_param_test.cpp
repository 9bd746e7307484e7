// Parameter offload (zero_optimization.offload_param.device = "cpu", ZeRO-3: this rank's weight
// partitions and the persistent segments in host memory, copied into the device's units when
// gathered) against independent computations, run by tessera-launch at 1, 2 and 4 ranks:
//   - the same ZeRO-3 run without any offload: every stored buffer, every loss and the gradient
//     norm bitwise equal, fp32, bf16 and bf16 master weights, with the optimizer beside the
//     parameters, offloaded to host memory and to NVMe, with accumulation and clipping;
//   - where the bytes are: the weight buffers counted in host memory, the device keeping only the
//     gathered units, the sum equal to what the run without offload holds;
//   - a gathered_parameters() write-back from one rank lands in the host partitions;
//   - offload_states/reload_states around it, and checkpoints between a run with parameter offload
//     and one without, continue bit for bit;
//   - bad input: offload_param below stage 3, offload_param on NVMe (not yet: refused by name);
//   - a negative control: another weight decay differs.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
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

enum class OptimizerHome { device, cpu, nvme };

struct Setup {
  std::string precision;  // a TOML section, empty for fp32
  bool parameters_offloaded = false;
  OptimizerHome optimizer = OptimizerHome::device;
  std::string nvme_path;  // OptimizerHome::nvme
  double weight_decay = 0.01;
};

std::string config(const Setup& s) {
  std::string sections;
  if (s.parameters_offloaded) sections += "[zero_optimization.offload_param]\ndevice = \"cpu\"\npin_memory = true\n";
  if (s.optimizer == OptimizerHome::cpu) sections += "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n";
  if (s.optimizer == OptimizerHome::nvme)
    sections += "[zero_optimization.offload_optimizer]\ndevice = \"nvme\"\nnvme_path = \"" + s.nvme_path + "\"\n";
  return offload_config(3, "gradient_clipping = 0.5\n" + s.precision, s.weight_decay, sections);
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const Setup& s) {
  return engine_from_toml(t, config(s), "offload_param_test");
}

tessera::transport::Communicator& test_comm() { return test_communicator("offload_param_test"); }

std::string fresh_dir(const std::string& name) { return fresh_shared_dir(test_comm(), "tessera_offload_param", name); }

TEST_CASE("Parameter offload trains bit for bit as ZeRO-3 with the parameters on the device", "[offload_param]") {
  struct Case { const char* name; std::string precision; OptimizerHome optimizer; };
  const std::vector<Case> cases = {{"fp32, optimizer beside the parameters", "", OptimizerHome::device},
                                   {"fp32, optimizer in host memory", "", OptimizerHome::cpu},
                                   {"bf16, optimizer beside the parameters", kBf16, OptimizerHome::device},
                                   {"bf16, optimizer in host memory", kBf16, OptimizerHome::cpu},
                                   {"bf16 masters, optimizer in host memory", kBf16Masters, OptimizerHome::cpu},
                                   {"bf16, optimizer on NVMe", kBf16, OptimizerHome::nvme}};
  for (const auto& c : cases) {
    INFO(c.name);
    Setup plain{c.precision};
    Setup offloaded{c.precision, true, c.optimizer};
    if (c.optimizer == OptimizerHome::nvme) offloaded.nvme_path = fresh_dir("train");
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain);
    auto on_host = engine_for(b, offloaded);
    CHECK(train(*on_device, a, 0, 4) == train(*on_host, b, 0, 4));
    expect_same_buffers(*on_device, *on_host);
    CHECK(on_device->last_grad_norm() == on_host->last_grad_norm());

    // Where the bytes are: the weight buffers in host memory, the gathered units on the device.
    const auto md = on_device->memory(), mh = on_host->memory();
    CHECK(md.host.parameters == 0);
    CHECK(mh.host.parameters > 0);
    CHECK(mh.host.parameters + mh.parameters == md.parameters);
    CHECK(mh.gradients == md.gradients);
  }
}

TEST_CASE("A gathered_parameters() write-back lands in the host partitions", "[offload_param]") {
  Setup plain{""}, offloaded{"", true, OptimizerHome::cpu};
  auto a = trainee(), b = trainee();
  auto on_device = engine_for(a, plain);
  auto on_host = engine_for(b, offloaded);
  for (auto* t : {&a, &b}) {
    auto& engine = t == &a ? *on_device : *on_host;
    train(engine, *t, 0, 1);
    {
      auto scope = engine.gathered_parameters({"h.0.mlp.c_fc.weight", "h.1.ln_1.bias"}, /*modifier_rank=*/0);
      if (kRank == 0) {
        torch::NoGradGuard no_grad;
        for (auto& p : t->gpt->module()->named_parameters())
          if (p.key() == "h.0.mlp.c_fc.weight" || p.key() == "h.1.ln_1.bias") p.value().mul_(0.5).add_(0.25);
      }
    }
    train(engine, *t, 1, 3);
  }
  expect_same_buffers(*on_device, *on_host);
}

TEST_CASE("offload_states/reload_states and checkpoints with parameter offload, bit for bit", "[offload_param][checkpoint]") {
  SECTION("offload_states: the units leave the device; after reload training continues as if never parked") {
    Setup plain{kBf16}, offloaded{kBf16, true, OptimizerHome::cpu};
    auto a = trainee(), b = trainee();
    auto never = engine_for(a, plain);
    auto parked = engine_for(b, offloaded);
    train(*never, a, 0, 2);
    train(*parked, b, 0, 2);
    const auto before = buffers(*parked);
    const auto moved = parked->offload_states();
    CHECK(moved.parameters == 0);  // the weight buffers are in host memory already
    CHECK(parked->memory().parameters == 0);  // nothing gathered is left on the device
    parked->reload_states();
    const auto changed = differing(before, buffers(*parked));
    INFO(changed.size() << " buffers changed by the round trip");
    CHECK(changed.empty());
    CHECK(train(*never, a, 2, 4) == train(*parked, b, 2, 4));
    expect_same_buffers(*never, *parked);
  }
  SECTION("checkpoints move between a run with parameter offload and one without") {
    for (const bool save_offloaded : {true, false}) {
      INFO((save_offloaded ? "saved with parameter offload" : "loaded with parameter offload"));
      const auto dir = fresh_dir(save_offloaded ? "from_host" : "to_host");
      const Setup on_device{""}, offloaded{"", true, OptimizerHome::cpu};
      const Setup saver = save_offloaded ? offloaded : on_device, loader = save_offloaded ? on_device : offloaded;
      expect_resume_as_uninterrupted(trainee, [&](const Trainee& t) { return engine_for(t, saver); },
                                     [&](const Trainee& t) { return engine_for(t, loader); }, dir);
    }
  }
}

TEST_CASE("Parameter offload below stage 3 or to NVMe is refused by name", "[offload_param]") {
  auto t = trainee();
  auto init = [&](const std::string& text) {
    return tessera::initialize(t.gpt->module(),
                               tessera::config::load_config_text(text, tessera::config::Format::toml, "bad_offload.toml"));
  };
  const std::string stage2 = "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n"
                             "[zero_optimization]\nstage = 2\n[zero_optimization.offload_param]\ndevice = \"cpu\"\n";
  CHECK_THROWS_WITH(init(stage2), Catch::Contains("zero_optimization.offload_param.device") && Catch::Contains("stage 3"));
  const std::string nvme = "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n"
                           "[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n"
                           "nvme_path = \"/tmp\"\n";
  CHECK_THROWS_WITH(init(nvme), Catch::Contains("zero_optimization.offload_param.device = \"nvme\": not yet supported"));
}

TEST_CASE("Negative control: a parameter-offloaded run with another weight decay differs", "[offload_param]") {
  Setup plain{""}, other{"", true, OptimizerHome::cpu};
  other.weight_decay = 0.02;
  expect_training_differs(trainee, [&](const Trainee& t) { return engine_for(t, plain); },
                          [&](const Trainee& t) { return engine_for(t, other); });
}

}  // namespace
