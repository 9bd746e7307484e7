// Partial optimizer offload (zero_optimization.offload_optimizer.ratio < 1: the first
// floor(ratio x sub-groups) of each rank step in host memory, the rest beside the parameters)
// against independent computations, run by tessera-launch at 1, 2 and 4 ranks:
//   - the same run without offload: every stored buffer and every loss bitwise equal, stages 2
//     and 3, fp32 and bf16 with fp32 masters, ratios 0.3, 0.5 and 0.75, gradient accumulation and
//     clipping; ratio 0 is the run without offload, also in where its bytes are;
//   - where the bytes are: the host's and the device's masters and states add up to what the run
//     without offload holds, each share non-empty, a larger ratio a larger host share;
//   - updating during backward with a device share (stage 3, no clipping), bit for bit;
//   - with the parameters in host memory too (offload_param), bit for bit;
//   - offload_states moves the device's share and reload_states brings it back, bit for bit;
//   - checkpoints saved partially offloaded and loaded without offload, and the other way round,
//     continue as one uninterrupted run (a split flat group's partitions are paged and written back);
//   - refusals naming the key: a ratio outside [0, 1], with NVMe, with a client optimizer; a ratio
//     without offload is warned of (DeepSpeed ignores it);
//   - a negative control: a partially offloaded run with another weight decay differs.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/offload_test_support.h"
#include "tests/engine/storage_snapshot.h"
#include "tests/engine/test_communicator.h"

namespace {

using namespace tessera::engine_testing;
using namespace tessera::offload_testing;
using tessera::Engine;

Trainee trainee() { return make_trainee(97, 7); }

struct Setup {
  int stage = 3;
  std::string precision;                                 // a TOML section, empty for fp32
  std::optional<double> ratio;                           // none: no optimizer offload
  std::string clipping = "gradient_clipping = 0.5\n";
  double weight_decay = 0.01;
  bool during_backward = false;
  std::string device = "cpu";
  bool parameters_offloaded = false;  // stage 3: offload_param.device = parameter_device too
  std::string parameter_device = "cpu";
  std::string parameter_swap_dir;  // parameter_device "nvme"
};

std::string config(const Setup& s) {
  std::string offload;
  if (s.ratio) {
    offload = "[zero_optimization.offload_optimizer]\ndevice = \"" + s.device + "\"\nratio = " + std::to_string(*s.ratio) + "\n";
    if (s.device == "nvme") offload += "nvme_path = \"/tmp\"\n";
  }
  if (s.parameters_offloaded) {
    offload += "[zero_optimization.offload_param]\ndevice = \"" + s.parameter_device + "\"\n";
    if (s.parameter_device == "nvme") offload += "nvme_path = \"" + s.parameter_swap_dir + "\"\nbuffer_size = 2048\nbuffer_count = 3\n";
  }
  if (s.during_backward) offload += "[tessera.offload]\noptimizer_during_backward = true\n";
  return offload_config(s.stage, s.clipping + s.precision, s.weight_decay, offload);
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const Setup& s, const tessera::InitializeOptions& options = {}) {
  return engine_from_toml(t, config(s), "partial_test", options);
}

TEST_CASE("Partial optimizer offload trains bit for bit as the optimizer beside the parameters", "[offload][partial]") {
  struct Case { int stage; const char* name; std::string precision; double ratio; };
  const std::vector<Case> cases = {{2, "fp32", "", 0.5}, {3, "fp32", "", 0.3}, {3, "fp32", "", 0.75},
                                   {2, "bf16", kBf16, 0.3}, {3, "bf16", kBf16, 0.5}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", " << c.name << ", ratio " << c.ratio);
    Setup plain{c.stage, c.precision};
    Setup partial = plain;
    partial.ratio = c.ratio;
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain);
    auto split = engine_for(b, partial);
    CHECK(train(*on_device, a, 0, 4) == train(*split, b, 0, 4));
    // Where the bytes are (before buffers() pages the split flat group's partitions into host
    // memory): the two shares add up to the states beside the parameters, each non-empty.
    const auto md = on_device->memory(), mp = split->memory();
    expect_same_buffers(*on_device, *split);
    CHECK(on_device->last_grad_norm() == split->last_grad_norm());

    CHECK(mp.parameters == md.parameters);
    CHECK(mp.gradients == md.gradients);
    CHECK(mp.optimizer_states + mp.host.optimizer_states == md.optimizer_states);
    CHECK(mp.host.optimizer_states > 0);
    CHECK(mp.optimizer_states > 0);
    if (md.master > 0) CHECK(mp.master + mp.host.master == md.master);  // fp32 masters: split alike
    CHECK(mp.host.master > 0);
    CHECK(mp.host.staging > 0);
    CHECK(split->last_step_timing().offload_copy_s > 0);
  }
}

tessera::transport::Communicator& test_comm();

TEST_CASE("Partial offload with the parameters in host memory or on NVMe too (the device's share steps those partitions)",
          "[offload][partial][offload_param]") {
  for (const std::string device : {"cpu", "nvme"})
  for (const std::string precision : {std::string(), std::string(kBf16)}) {
    INFO((precision.empty() ? "fp32" : "bf16") << ", parameters on " << device);
    Setup plain{3, precision};
    Setup both = plain;
    both.ratio = 0.5, both.parameters_offloaded = true, both.parameter_device = device;
    if (device == "nvme") both.parameter_swap_dir = fresh_shared_dir(test_comm(), "tessera_partial", std::string("params") + (precision.empty() ? "_fp32" : "_bf16"));
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain), offloaded = engine_for(b, both);
    CHECK(train(*on_device, a, 0, 3) == train(*offloaded, b, 0, 3));
    const auto m = offloaded->memory();
    CHECK(m.host.parameters > 0);
    CHECK(m.host.optimizer_states > 0);
    CHECK(m.optimizer_states > 0);
    expect_same_buffers(*on_device, *offloaded);
  }
}

TEST_CASE("A larger ratio puts a larger share on the host; ratio 0 is no offload", "[offload][partial]") {
  auto share = [](double ratio) {
    Setup s;
    s.ratio = ratio;
    auto t = trainee();
    auto e = engine_for(t, s);
    train(*e, t, 0, 1);
    return e->memory();
  };
  const auto low = share(0.25), high = share(0.75), none = share(0.0);
  CHECK(low.host.optimizer_states < high.host.optimizer_states);
  CHECK(low.optimizer_states > high.optimizer_states);
  CHECK(none.host.total() == 0);
  CHECK(none.master == 0);  // fp32 weights: their own master, as without offload

  Setup plain, zero;
  zero.ratio = 0.0;
  auto a = trainee(), b = trainee();
  auto on_device = engine_for(a, plain), at_zero = engine_for(b, zero);
  CHECK(train(*on_device, a, 0, 3) == train(*at_zero, b, 0, 3));
  expect_same_buffers(*on_device, *at_zero);
}

TEST_CASE("Partial offload updates its host share during backward, bit for bit", "[offload][partial]") {
  for (const std::string precision : {std::string(), std::string(kBf16)}) {
    INFO((precision.empty() ? "fp32" : "bf16"));
    Setup plain{3, precision};
    plain.clipping = "";
    Setup overlapped = plain;
    overlapped.ratio = 0.5, overlapped.during_backward = true;
    auto a = trainee(), b = trainee();
    auto on_device = engine_for(a, plain), early = engine_for(b, overlapped);
    CHECK(train(*on_device, a, 0, 4) == train(*early, b, 0, 4));
    expect_same_buffers(*on_device, *early);
  }
}

TEST_CASE("offload_states moves the device's share of a partial offload; reload_states continues bit for bit",
          "[offload][partial][offload_states]") {
  Setup plain{3, kBf16};
  Setup partial = plain;
  partial.ratio = 0.5;
  auto a = trainee(), b = trainee();
  auto never = engine_for(a, plain), parked = engine_for(b, partial);
  auto losses_a = train(*never, a, 0, 2);
  auto losses_b = train(*parked, b, 0, 2);
  const auto held = parked->memory();  // (before buffers() pages a split group in)
  const auto before = buffers(*parked);
  REQUIRE(held.optimizer_states > 0);
  const auto moved = parked->offload_states();
  CHECK(moved.optimizer_states == held.optimizer_states);  // the device's share; the host's stays
  CHECK(moved.master_weights == held.master);
  const auto m = parked->memory();
  CHECK(m.optimizer_states == 0);
  CHECK(m.master == 0);
  CHECK(m.host.optimizer_states == held.host.optimizer_states);
  parked->reload_states();
  CHECK(differing(before, buffers(*parked)).empty());
  auto more_a = train(*never, a, 2, 4);
  auto more_b = train(*parked, b, 2, 4);
  CHECK(more_a == more_b);
  expect_same_buffers(*never, *parked);
}

tessera::transport::Communicator& test_comm() { return test_communicator("offload_partial_test"); }

TEST_CASE("Checkpoints move between partially offloaded and on-device optimizers bit for bit",
          "[offload][partial][checkpoint]") {
  for (const bool save_partial : {true, false}) {
    for (const std::string precision : {std::string(), std::string(kBf16)}) {
      INFO((save_partial ? "saved partially offloaded, loaded on the device" : "saved on the device, loaded partially offloaded")
           << (precision.empty() ? ", fp32" : ", bf16"));
      const auto dir = fresh_shared_dir(test_comm(), "tessera_partial",
                                        std::string(save_partial ? "from_split" : "to_split") + (precision.empty() ? "_fp32" : "_bf16"));
      Setup saver{3, precision}, loader{3, precision};
      (save_partial ? saver : loader).ratio = 0.5;
      expect_resume_as_uninterrupted(trainee, [&](const Trainee& t) { return engine_for(t, saver); },
                                     [&](const Trainee& t) { return engine_for(t, loader); }, dir);
    }
  }
}

void refused(const Setup& s, const std::string& words) {
  expect_refused(trainee(), config(s), "zero_optimization.offload_optimizer.ratio", words);
}

TEST_CASE("Partial offload refuses what it cannot do, naming the key", "[offload][partial]") {
  Setup s;
  SECTION("a ratio outside [0, 1]") {
    s.ratio = 1.5;
    refused(s, "expected a ratio in [0, 1]");
  }
  SECTION("a ratio without offload: no effect, said in a warning (DeepSpeed ignores it)") {
    s.ratio = 0.5, s.device = "none";
    const auto c = tessera::config::load_config_text(config(s), tessera::config::Format::toml, "partial_test");
    bool warned = false;
    for (const auto& w : c.warnings) warned = warned || (w.find("zero_optimization.offload_optimizer.ratio") != std::string::npos &&
                                                          w.find("no effect") != std::string::npos);
    CHECK(warned);
  }
  SECTION("a ratio with NVMe") {
    s.ratio = 0.5, s.device = "nvme";
    refused(s, "not yet supported");
  }
  SECTION("a client optimizer") {
    s.ratio = 0.5, s.clipping = "";
    auto t = trainee();
    tessera::InitializeOptions options;
    // (RMSprop: not one tessera translates into its own kernel, so it runs by its own step().)
    options.optimizer = std::make_shared<torch::optim::RMSprop>(t.gpt->module()->parameters(), torch::optim::RMSpropOptions(2e-3));
    auto text = offload_config(s.stage, "", std::nullopt,
                               "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\nratio = 0.5\n");
    expect_refused(t, text, "zero_optimization.offload_optimizer.ratio", "client optimizer", options);
  }
}

TEST_CASE("Negative control: a partially offloaded run with another weight decay differs", "[offload][partial]") {
  Setup plain;
  Setup other = plain;
  other.ratio = 0.5, other.weight_decay = 0.02;
  expect_training_differs(trainee, [&](const Trainee& t) { return engine_for(t, plain); },
                          [&](const Trainee& t) { return engine_for(t, other); });
}

}  // namespace
