// ZeRO-3 gathers ahead and keeps for reuse (actors/stage3_parameter_shard.cpp), checked by their
// results and their counters, never by time:
//  - ZeRO inference: each Engine::forward is a window; the first is recorded, later ones prefetch
//    along it; logits stay bitwise equal to an unpartitioned model, nothing stays gathered after
//    a window, a window that leaves the order is counted and still correct.
//  - stage3_max_reuse_distance: training with units kept for their next use equals training with
//    every unit released after each use (and the single-process oracle through engine.oracle),
//    bitwise; it gathers less; with a tight stage3_max_live_parameters nothing is kept past it.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

constexpr int64_t kPersistence = 100;

std::shared_ptr<tessera::Engine> engine_for(std::shared_ptr<torch::nn::Module> m, const std::string& text) {
  return tessera::initialize(std::move(m), tessera::config::load_config_text(text, tessera::config::Format::toml, "prefetch"))
      .engine;
}

torch::Tensor tokens(int rank, int i) {
  auto g = at::detail::createCPUGenerator(uint64_t(10 * i + rank));
  return torch::randint(0, 256, {4, 16}, g, torch::kLong);
}

// Gathers a rank issued: on demand (fetches that found nothing) plus ahead of demand.
int64_t gathers(const tessera::Stage3Stats& s) { return s.fetches - s.prefetched - s.already_gathered + s.prefetch_issued; }

// The largest unit's gathered elements (a module's own parameters above the persistence threshold).
int64_t largest_unit(torch::nn::Module& model) {
  int64_t largest = 0;
  for (const auto& item : model.named_modules()) {
    int64_t n = 0;
    for (const auto& p : item.value()->parameters(/*recurse=*/false))
      if (p.numel() > kPersistence) n += p.numel();
    largest = std::max(largest, n);
  }
  return largest;
}

}  // namespace

TEST_CASE("ZeRO inference prefetches in each Engine::forward along the first one's order", "[prefetch]") {
  tessera::nn::TinyGpt model(small_gpt_config(21)), oracle(small_gpt_config(21));
  auto engine = engine_for(model.module(), "train_micro_batch_size_per_gpu = 4\n[zero_optimization]\nstage = 3\n"
                                           "stage3_param_persistence_threshold = 100\n"
                                           "[tessera.transport]\ncollective_timeout_ms = 60000\n");
  auto released = [&] { return model.module()->named_parameters()["h.0.mlp.c_fc.weight"].storage().nbytes() == 0; };
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 4; ++i) {
    const auto before = engine->stage3_stats();
    auto logits = engine->forward([&] { return model.forward(tokens(kRank, i)); });
    CHECK(torch::equal(logits, oracle.forward(tokens(kRank, i))));
    const auto after = engine->stage3_stats();
    INFO("window " << i << ": fetches " << after.fetches - before.fetches << ", prefetched "
                   << after.prefetched - before.prefetched << ", issued ahead " << after.prefetch_issued - before.prefetch_issued);
    if (i == 0) CHECK(after.prefetch_issued == before.prefetch_issued);  // the recording window
    else CHECK(after.prefetched - before.prefetched == after.fetches - before.fetches - 1);  // all but the first
    CHECK(after.divergences == 0);
    CHECK(released());
  }
  // Outside Engine::forward: on demand, nothing issued ahead.
  auto before = engine->stage3_stats();
  CHECK(torch::equal(model.forward(tokens(kRank, 9)), oracle.forward(tokens(kRank, 9))));
  CHECK(engine->stage3_stats().prefetch_issued == before.prefetch_issued);
  CHECK(released());
  // A window running two forwards leaves the order at the second: counted, still correct.
  auto two = engine->forward([&] { return model.forward(tokens(kRank, 5)) + model.forward(tokens(kRank, 6)); });
  CHECK(torch::equal(two, oracle.forward(tokens(kRank, 5)) + oracle.forward(tokens(kRank, 6))));
  CHECK(engine->stage3_stats().divergences == 1);
  CHECK(released());
}

TEST_CASE("Units kept for reuse (stage3_max_reuse_distance) train bitwise as units released after each use", "[prefetch]") {
  struct Run {
    std::map<std::string, torch::Tensor> params;
    tessera::Stage3Stats stats;
    int64_t largest = 0;
  };
  auto train = [](int64_t reuse, int64_t max_live, int64_t bucket) {
    tessera::nn::TinyGpt model(small_gpt_config(8));
    const std::string toml = "train_micro_batch_size_per_gpu = 4\ngradient_accumulation_steps = 2\n[optimizer]\n"
                             "type = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n[zero_optimization]\n"
                             "stage = 3\nstage3_param_persistence_threshold = " + std::to_string(kPersistence) +
                             "\nstage3_max_reuse_distance = " + std::to_string(reuse) +
                             "\nstage3_max_live_parameters = " + std::to_string(max_live) +
                             "\nstage3_prefetch_bucket_size = " + std::to_string(bucket) +
                             "\n[tessera.transport]\ncollective_timeout_ms = 60000\n";
    auto engine = engine_for(model.module(), toml);
    for (int step = 0; step < 4; ++step)
      for (int micro = 0; micro < 2; ++micro) {
        auto x = tokens(kRank, 2 * step + micro);
        engine->backward(model.loss(x.narrow(1, 0, 15), x.narrow(1, 1, 15)));
        engine->step();
      }
    Run r;
    r.stats = engine->stage3_stats();
    r.largest = largest_unit(*model.module());
    auto gathered = engine->gathered_parameters();
    r.params = snapshot_parameters(*model.module());
    return r;
  };
  const int64_t unlimited = 1'000'000'000;
  const auto released = train(0, unlimited, 5000);
  const auto kept = train(unlimited, unlimited, 5000);  // DeepSpeed's default distance
  INFO("gathers: released after each use " << gathers(released.stats) << ", kept for reuse " << gathers(kept.stats)
                                            << " (" << kept.stats.kept_for_reuse << " releases skipped)");
  CHECK(released.stats.kept_for_reuse == 0);
  CHECK(kept.stats.kept_for_reuse > 0);
  CHECK(gathers(kept.stats) < gathers(released.stats));
  CHECK(kept.stats.divergences == 0);
  expect_same_parameters(kept.params, released.params);
  // Without prefetch the record is followed all the same: units are kept for reuse.
  const auto no_prefetch = train(unlimited, unlimited, 0);
  CHECK(no_prefetch.stats.prefetch_issued == 0);
  CHECK(no_prefetch.stats.kept_for_reuse > 0);
  expect_same_parameters(no_prefetch.params, released.params);
  // A tight live bound: at most max_live elements stay gathered, plus the unit a fetch asks for.
  const int64_t max_live = 2 * released.largest;
  const auto tight = train(unlimited, max_live, 5000);
  INFO("peak gathered " << tight.stats.peak_gathered_bytes << " bytes; bound " << (max_live + tight.largest) * 4);
  CHECK(tight.stats.peak_gathered_bytes <= (max_live + tight.largest) * 4);
  CHECK(kept.stats.peak_gathered_bytes > (max_live + tight.largest) * 4);  // the bound is what held it
  expect_same_parameters(tight.params, released.params);
}

// Every fetch that follows the record prefetches after the recording window, whatever its kind:
// backward fetches (all but the first of a backward, whose unit the forward just released with
// stage3_max_reuse_distance 0), forwards under torch_autocast, and ZeRO inference forwards under
// autocast. (The fetch message once carried its kind in an int with flags, and only the plain
// forward value prefetched: backward and autocast fetches never did, results unchanged.)
TEST_CASE("After the recording window backward and autocast fetches are prefetched too", "[prefetch]") {
  const std::string autocast = "[torch_autocast]\nenabled = true\ndtype = \"bfloat16\"\n";
  const std::string zero = "[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = " +
                           std::to_string(kPersistence) + "\nstage3_max_reuse_distance = 0\nstage3_prefetch_bucket_size = 5000\n"
                           "[tessera.transport]\ncollective_timeout_ms = 60000\n";
  for (bool under_autocast : {false, true}) {
    INFO("training, torch_autocast " << under_autocast);
    tessera::nn::TinyGpt model(small_gpt_config(8));
    auto engine = engine_for(model.module(), "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n"
                                             "[optimizer.params]\nlr = 3e-3\n" + (under_autocast ? autocast : "") + zero);
    auto step = [&](int i) {
      auto x = tokens(kRank, i);
      engine->backward(engine->forward([&] { return model.loss(x.narrow(1, 0, 15), x.narrow(1, 1, 15)); }));
      engine->step();
    };
    step(0);  // the recording window
    const auto before = engine->stage3_stats();
    const int steps = 3;
    for (int i = 1; i <= steps; ++i) step(i);
    const auto after = engine->stage3_stats();
    const auto backward = after.backward.fetches - before.backward.fetches;
    const auto backward_ahead = after.backward.prefetched - before.backward.prefetched;
    const auto forward = after.forward.fetches - before.forward.fetches;
    const auto forward_ahead = after.forward.prefetched - before.forward.prefetched;
    INFO("backward fetches " << backward << ", prefetched " << backward_ahead << "; forward fetches " << forward
                             << ", prefetched " << forward_ahead);
    REQUIRE(backward > 2 * steps);
    CHECK(backward_ahead == backward - steps);  // all but each backward's first
    CHECK(forward_ahead == forward - steps);    // all but each forward's first
    CHECK(after.divergences == 0);
    CHECK(after.fetches == after.scope.fetches + after.forward_no_grad.fetches + after.forward.fetches + after.backward.fetches);
  }
  SECTION("ZeRO inference under autocast") {
    tessera::nn::TinyGpt model(small_gpt_config(21));
    auto engine = engine_for(model.module(), "train_micro_batch_size_per_gpu = 4\n" + autocast + zero);
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 3; ++i) {
      const auto before = engine->stage3_stats();
      (void)engine->forward([&] { return model.forward(tokens(kRank, i)); });
      const auto after = engine->stage3_stats();
      const auto fetches = after.forward_no_grad.fetches - before.forward_no_grad.fetches;
      INFO("window " << i << ": fetches " << fetches);
      if (i > 0) CHECK(after.forward_no_grad.prefetched - before.forward_no_grad.prefetched == fetches - 1);
    }
  }
}
