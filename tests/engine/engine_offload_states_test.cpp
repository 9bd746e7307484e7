// offload_states / reload_states (colocated RL) against independent computations, run by
// tessera-launch at 1, 2 and 4 ranks:
//   - the same training without them: after offload_states, reload_states and more steps, every
//     stored buffer (weights, masters, each optimizer state) and every loss is bitwise equal to an
//     engine that never offloaded, at stages 0-3 in fp32 and bf16 and with optimizer offload;
//   - the snapshot taken before offload_states: reload_states gives back the same bytes;
//   - where the memory is: every module parameter's storage (and each ZeRO-3 unit's) has 0 bytes
//     while offloaded, memory() counts the moved bytes on the host, and what moved per kind equals
//     what the engine that never offloaded holds of that kind;
//   - only what `include` names moves (the weights keep their memory when only the optimizer's move);
//   - everything that would touch a moved buffer raises, naming reload_states;
//   - a negative control: a single changed element after reload is seen by the same comparison.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"
#include "tests/engine/storage_snapshot.h"

namespace {

using namespace tessera::engine_testing;
using tessera::Engine;
using tessera::OffloadState;

constexpr int kGlobalBatch = 8;  // divisible by 1, 2 and 4 ranks

struct Trainee {
  std::shared_ptr<tessera::nn::TinyGpt> gpt;
  torch::Tensor loss(int step, int rank) const {
    auto batch = corpus().batch(11, step, 0, kGlobalBatch, 16, rank, kWorld);
    return gpt->loss(batch.tokens, batch.targets);
  }
};

Trainee trainee() { return {std::make_shared<tessera::nn::TinyGpt>(small_gpt_config(37))}; }

std::shared_ptr<Engine> engine_for(const Trainee& t, int stage, const std::string& extra, bool optimizer_offload = false) {
  const std::string text = "train_micro_batch_size_per_gpu = " + std::to_string(kGlobalBatch / kWorld) +
                           "\ngradient_clipping = 0.5\n" + extra +
                           "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
                           "[zero_optimization]\nstage = " + std::to_string(stage) +
                           "\nreduce_bucket_size = 3000\nstage3_param_persistence_threshold = 100\n" +
                           (optimizer_offload ? "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n" : "") +
                           "[tessera.transport]\ncollective_timeout_ms = 60000\n";
  auto config = tessera::config::load_config_text(text, tessera::config::Format::toml, "offload_states_test");
  return tessera::initialize(t.gpt->module(), config).engine;
}

std::vector<double> train(Engine& engine, const Trainee& t, int from, int to) {
  std::vector<double> losses;
  for (int step = from; step < to; ++step) {
    auto loss = t.loss(step, kRank);
    engine.backward(loss);
    engine.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

int64_t parameter_storage_bytes(const Trainee& t) {
  int64_t n = 0;
  for (const auto& p : t.gpt->module()->parameters()) n += int64_t(p.storage().nbytes());
  return n;
}

template <typename F>
void refused(F&& call, const char* what) {
  INFO(what);
  CHECK_THROWS_WITH(call(), Catch::Contains("offload_states") && Catch::Contains("reload_states()"));
}

const char* kBf16 = "[bf16]\nenabled = true\n";

TEST_CASE("offload_states then reload_states continue bit for bit as training that never offloaded", "[offload_states]") {
  struct Case { int stage; const char* name; std::string extra; bool optimizer_offload; };
  const std::vector<Case> cases = {{0, "fp32", "", false},   {1, "fp32", "", false},   {2, "fp32", "", false},
                                   {3, "fp32", "", false},   {1, "bf16", kBf16, false}, {2, "bf16", kBf16, false},
                                   {3, "bf16", kBf16, false}, {2, "bf16, optimizer offload", kBf16, true}};
  for (const auto& c : cases) {
    INFO("stage " << c.stage << ", " << c.name);
    auto a = trainee(), b = trainee();
    auto never = engine_for(a, c.stage, c.extra, c.optimizer_offload);
    auto parked = engine_for(b, c.stage, c.extra, c.optimizer_offload);
    auto losses_a = train(*never, a, 0, 3);
    auto losses_b = train(*parked, b, 0, 3);
    const auto before = buffers(*parked);
    const auto held = never->memory();
    REQUIRE(parameter_storage_bytes(b) > 0);

    const auto moved = parked->offload_states();
    CHECK(parked->states_offloaded());
    CHECK(parameter_storage_bytes(b) == 0);  // the module's weights (ZeRO-3: every unit) have no memory
    const auto m = parked->memory();
    CHECK(m.host.offloaded == moved.total());
    CHECK(moved.parameters == held.parameters);
    CHECK(moved.master_weights == held.master);
    CHECK(moved.optimizer_states == held.optimizer_states);
    CHECK(moved.gradients > 0);
    CHECK(m.parameters == 0);
    CHECK(m.master == 0);
    CHECK(m.optimizer_states == 0);
    CHECK(m.gradients == held.gradients - moved.gradients);
    if (c.optimizer_offload) CHECK(held.optimizer_states == 0);  // in host memory already

    refused([&] { parked->step(); }, "step");
    // (No forward here: the weights have no memory. A scalar that requires grad reaches the check.)
    refused([&] { parked->backward(torch::ones({}, torch::requires_grad())); }, "backward");
    refused([&] { (void)parked->storage_maps(); }, "storage_maps");
    refused([&] { parked->save_checkpoint("/nonexistent"); }, "save_checkpoint");

    const auto back = parked->reload_states();
    CHECK(back.total() == moved.total());
    CHECK_FALSE(parked->states_offloaded());
    CHECK(parameter_storage_bytes(b) > 0);  // (ZeRO-3: the persistent parameters; units are gathered when used)
    const auto after = buffers(*parked);
    const auto restored = differing(before, after);
    INFO(restored.size() << " buffers changed by the round trip");
    CHECK(restored.empty());
    CHECK(parked->memory().host.offloaded == 0);

    auto more_a = train(*never, a, 3, 6);
    auto more_b = train(*parked, b, 3, 6);
    losses_a.insert(losses_a.end(), more_a.begin(), more_a.end());
    losses_b.insert(losses_b.end(), more_b.begin(), more_b.end());
    CHECK(losses_a == losses_b);
    const auto diff = differing(buffers(*never), buffers(*parked));
    INFO(diff.size() << " buffers differ from the run that never offloaded");
    CHECK(diff.empty());
  }
}

TEST_CASE("offload_states moves only what include names", "[offload_states]") {
  for (int stage : {1, 3}) {
    INFO("stage " << stage);
    auto t = trainee();
    auto engine = engine_for(t, stage, "");
    train(*engine, t, 0, 1);
    const int64_t weights = parameter_storage_bytes(t);
    tessera::OffloadStatesOptions options;
    options.include = {OffloadState::optimizer_states, OffloadState::master_weights};
    const auto moved = engine->offload_states(options);
    CHECK(moved.optimizer_states > 0);
    CHECK(moved.parameters == 0);
    CHECK(moved.gradients == 0);
    CHECK(parameter_storage_bytes(t) == weights);  // the weights are where they were
    // A forward still runs (ZeRO-3 gathers from the partitions, which stayed), a step does not.
    torch::NoGradGuard no_grad;
    CHECK_NOTHROW(t.loss(1, kRank));
    refused([&] { engine->step(); }, "step");
    engine->reload_states();
    CHECK(engine->memory().optimizer_states == moved.optimizer_states);
  }
}

TEST_CASE("offload_states refuses bad calls before moving anything", "[offload_states]") {
  auto t = trainee();
  auto engine = engine_for(t, 3, "");
  train(*engine, t, 0, 1);
  tessera::OffloadStatesOptions nvme;
  nvme.device = tessera::config::OffloadDevice::nvme;
  CHECK_THROWS_WITH(engine->offload_states(nvme), Catch::Contains("only cpu"));
  {
    auto scope = engine->gathered_parameters();
    CHECK_THROWS_WITH(engine->offload_states(), Catch::Contains("inside gathered_parameters()"));
  }
  CHECK_FALSE(engine->states_offloaded());
  // Mid-batch (gradients of a backward not yet stepped) is refused too.
  engine->backward(t.loss(1, kRank));
  CHECK_THROWS_WITH(engine->offload_states(), Catch::Contains("between step() and the next backward"));
  engine->step();
  CHECK(engine->reload_states().total() == 0);  // nothing offloaded: nothing to bring back
}

TEST_CASE("Negative control: a changed element after the round trip is seen", "[offload_states]") {
  auto t = trainee();
  auto engine = engine_for(t, 2, "");
  train(*engine, t, 0, 1);
  const auto before = buffers(*engine);
  engine->offload_states();
  engine->reload_states();
  {
    torch::NoGradGuard no_grad;
    auto p = t.gpt->module()->parameters().front();
    p.view(-1)[0].add_(1.0);
  }
  CHECK_FALSE(differing(before, buffers(*engine)).empty());
}

}  // namespace
