// Parameter offload (zero_optimization.offload_param.device = "cpu" / "nvme", ZeRO-3: this rank's
// weight partitions in host memory or in a swap file under nvme_path (a few chunks in host memory),
// the persistent segments in host memory, copied into the device's units when gathered) against
// independent computations, run by tessera-launch at 1, 2 and 4 ranks:
//   - the same ZeRO-3 run without any offload: every stored buffer, every loss and the gradient
//     norm bitwise equal, fp32, bf16 and bf16 master weights, with the optimizer beside the
//     parameters, offloaded to host memory and to NVMe, with accumulation and clipping; on NVMe
//     with chunks far smaller than the partitions (buffer_size 2048, buffer_count 3), so that the
//     gathers read evicted chunks back;
//   - where the bytes are: the weight buffers counted in host memory (cpu), or the partitions in
//     the swap file and only its buffers in host memory until storage_maps() pages them in (nvme);
//     the device keeping only the gathered units;
//   - a gathered_parameters() write-back from one rank lands in the host or swapped partitions;
//   - offload_states/reload_states around it, and checkpoints between a run with parameter offload
//     and one without, continue bit for bit;
//   - bad input: offload_param below stage 3, an nvme_path that is not a directory (named);
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
enum class ParameterHome { device, cpu, nvme };

struct Setup {
  std::string precision;  // a TOML section, empty for fp32
  ParameterHome parameters = ParameterHome::device;
  OptimizerHome optimizer = OptimizerHome::device;
  std::string nvme_path;  // OptimizerHome::nvme or ParameterHome::nvme
  double weight_decay = 0.01;
};

std::string config(const Setup& s) {
  std::string sections;
  if (s.parameters == ParameterHome::cpu) sections += "[zero_optimization.offload_param]\ndevice = \"cpu\"\npin_memory = true\n";
  if (s.parameters == ParameterHome::nvme)
    sections += "[zero_optimization.offload_param]\ndevice = \"nvme\"\nnvme_path = \"" + s.nvme_path +
                "\"\nbuffer_size = 2048\nbuffer_count = 3\n";
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
  struct Case { const char* name; std::string precision; ParameterHome parameters; OptimizerHome optimizer; };
  const std::vector<Case> cases = {
      {"fp32, parameters in host memory, optimizer beside them", "", ParameterHome::cpu, OptimizerHome::device},
      {"fp32, parameters and optimizer in host memory", "", ParameterHome::cpu, OptimizerHome::cpu},
      {"bf16, parameters in host memory, optimizer beside them", kBf16, ParameterHome::cpu, OptimizerHome::device},
      {"bf16, parameters and optimizer in host memory", kBf16, ParameterHome::cpu, OptimizerHome::cpu},
      {"bf16 masters, parameters and optimizer in host memory", kBf16Masters, ParameterHome::cpu, OptimizerHome::cpu},
      {"bf16, parameters in host memory, optimizer on NVMe", kBf16, ParameterHome::cpu, OptimizerHome::nvme},
      {"fp32, parameters on NVMe, optimizer beside them", "", ParameterHome::nvme, OptimizerHome::device},
      {"bf16, parameters on NVMe, optimizer in host memory", kBf16, ParameterHome::nvme, OptimizerHome::cpu},
      {"bf16 masters, parameters and optimizer on NVMe", kBf16Masters, ParameterHome::nvme, OptimizerHome::nvme}};
  for (const auto& c : cases) {
    INFO(c.name);
    Setup plain{c.precision};
    Setup offloaded{c.precision, c.parameters, c.optimizer};
    if (c.optimizer == OptimizerHome::nvme || c.parameters == ParameterHome::nvme) offloaded.nvme_path = fresh_dir("train");
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain);
    auto on_host = engine_for(b, offloaded);
    CHECK(train(*on_device, a, 0, 4) == train(*on_host, b, 0, 4));
    CHECK(on_device->last_grad_norm() == on_host->last_grad_norm());

    // Where the bytes are: the weight buffers in host memory (or the partitions in the swap file),
    // the gathered units on the device.
    const auto md = on_device->memory(), mh = on_host->memory();
    CHECK(md.host.parameters == 0);
    CHECK(mh.gradients == md.gradients);
    if (c.parameters == ParameterHome::cpu) {
      CHECK(mh.host.parameters > 0);
      CHECK(mh.host.parameters + mh.parameters == md.parameters);
    } else {
      const int64_t element = c.precision.empty() ? 4 : 2;
      CHECK(mh.host.parameters + mh.parameters < md.parameters);  // the partitions are not in memory
      CHECK(mh.nvme >= md.parameters - mh.parameters - mh.host.parameters);
      CHECK(mh.host.swap_buffers > 0);
      if (c.optimizer != OptimizerHome::nvme) CHECK(mh.host.swap_buffers <= 3 * ((2048 * element + 4095) / 4096 * 4096));
    }
    expect_same_buffers(*on_device, *on_host);
    if (c.parameters == ParameterHome::nvme) {  // storage_maps() paged the partitions in, lent until the next gather
      // The partitions (what the device run holds beyond the units and the persistent segments) are
      // in host memory now, and the persistent segments twice: in place and in the lent copy.
      const auto lent = on_host->memory();
      const int64_t partitions = md.parameters - mh.parameters - mh.host.parameters;
      CHECK(partitions > 0);
      CHECK(lent.host.parameters == partitions + 2 * mh.host.parameters);
    }
  }
}

TEST_CASE("A gathered_parameters() write-back lands in the host or swapped partitions", "[offload_param]") {
  for (const auto home : {ParameterHome::cpu, ParameterHome::nvme}) {
  INFO((home == ParameterHome::cpu ? "parameters in host memory" : "parameters on NVMe"));
  Setup plain{""}, offloaded{"", home, OptimizerHome::cpu};
  if (home == ParameterHome::nvme) offloaded.nvme_path = fresh_dir("writeback");
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
}

TEST_CASE("offload_states/reload_states and checkpoints with parameter offload, bit for bit", "[offload_param][checkpoint]") {
  for (const auto home : {ParameterHome::cpu, ParameterHome::nvme}) {
    INFO((home == ParameterHome::cpu ? "parameters in host memory" : "parameters on NVMe"));
    const std::string where = home == ParameterHome::cpu ? "host" : "nvme";
    SECTION("offload_states: the units leave the device; after reload training continues as if never parked") {
      Setup plain{kBf16}, offloaded{kBf16, home, OptimizerHome::cpu};
      if (home == ParameterHome::nvme) offloaded.nvme_path = fresh_dir("parked_" + where);
      auto a = trainee(), b = trainee();
      auto never = engine_for(a, plain);
      auto parked = engine_for(b, offloaded);
      train(*never, a, 0, 2);
      train(*parked, b, 0, 2);
      const auto before = buffers(*parked);
      const auto moved = parked->offload_states();
      CHECK(moved.parameters == 0);  // the weight buffers are in host memory (or the swap file) already
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
        const auto dir = fresh_dir((save_offloaded ? "from_" : "to_") + where);
        Setup on_device{""}, offloaded{"", home, OptimizerHome::cpu};
        if (home == ParameterHome::nvme) offloaded.nvme_path = fresh_dir("swap_" + where + (save_offloaded ? "_s" : "_l"));
        const Setup saver = save_offloaded ? offloaded : on_device, loader = save_offloaded ? on_device : offloaded;
        expect_resume_as_uninterrupted(trainee, [&](const Trainee& t) { return engine_for(t, saver); },
                                       [&](const Trainee& t) { return engine_for(t, loader); }, dir);
      }
    }
  }
}

TEST_CASE("Parameter offload below stage 3, to an nvme_path that is no directory or with one buffer, is refused by name", "[offload_param]") {
  auto t = trainee();
  auto init = [&](const std::string& text) {
    return tessera::initialize(t.gpt->module(),
                               tessera::config::load_config_text(text, tessera::config::Format::toml, "bad_offload.toml"));
  };
  const std::string stage2 = "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n"
                             "[zero_optimization]\nstage = 2\n[zero_optimization.offload_param]\ndevice = \"cpu\"\n";
  CHECK_THROWS_WITH(init(stage2), Catch::Contains("zero_optimization.offload_param.device") && Catch::Contains("stage 3"));
  const std::string missing = "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n"
                              "[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n"
                              "nvme_path = \"/nonexistent/tessera\"\n";
  CHECK_THROWS_WITH(init(missing), Catch::Contains("zero_optimization.offload_param.nvme_path = \"/nonexistent/tessera\"") &&
                                       Catch::Contains("No such file or directory"));
  const std::string one_buffer = "train_micro_batch_size_per_gpu = 2\n[optimizer]\ntype = \"AdamW\"\n"
                                 "[zero_optimization]\nstage = 3\n[zero_optimization.offload_param]\ndevice = \"nvme\"\n"
                                 "nvme_path = \"" + fresh_dir("one_buffer") + "\"\nbuffer_count = 1\n";
  CHECK_THROWS_WITH(init(one_buffer), Catch::Contains("zero_optimization.offload_param.buffer_count = 1: parameters on NVMe "
                                                      "need at least 2 buffers"));
}

TEST_CASE("Negative control: a parameter-offloaded run with another weight decay differs", "[offload_param]") {
  Setup plain{""}, other{"", ParameterHome::nvme, OptimizerHome::cpu};
  other.nvme_path = fresh_dir("control");
  other.weight_decay = 0.02;
  expect_training_differs(trainee, [&](const Trainee& t) { return engine_for(t, plain); },
                          [&](const Trainee& t) { return engine_for(t, other); });
}

}  // namespace
