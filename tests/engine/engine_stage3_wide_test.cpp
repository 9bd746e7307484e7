// ZeRO-3 on units of several MiB against stage 0, bitwise at <= 2 ranks, many times over: the MLP
// of ../shared/fixtures/deepspeed_checkpoints/README.md (torch::manual_seed(1234); Linear(256, W),
// ReLU, three Linear(W, W) + ReLU, Linear(W, 16); batch 32 per rank from a generator seeded
// 10000 * step + rank, x then y from randn; MSE; Adam lr 1e-3; fp32) at width W = 2048 by default:
// one unit is 16 MiB, more than any chunk or bucket of the engine (the reduce and prefetch buckets
// are set below a unit). The ranks run at uneven speeds: a Sleep entry between the layers (forward)
// and a Sleep node in backward stall one rank or the other for a few milliseconds, drawn from a
// seeded generator, so gathers, releases and reduce-scatters meet in different interleavings on
// every run. Stage 3 used to differ from stage 0 from step 2 on in most runs at this width (a
// gradient buffer freed while its reduce-scatter still read it).
//
// TESSERA_WIDE_WIDTH and TESSERA_WIDE_RUNS override the width and the number of stage-3 runs
// (e.g. 4096 and 20 for a longer hunt).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "tests/engine/stage3_test_support.h"

namespace {

using namespace tessera::stage3_testing;

int64_t env_or(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::stoll(v) : fallback;
}

// Stalls one rank now and then, so the ranks reach each collective at different times.
struct Jitter {
  std::mt19937 rng;
  explicit Jitter(uint32_t seed) : rng(seed) {}
  void maybe_sleep() {
    if (rng() % 3 != 0) return;
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 4000));
  }
};

// The identity that stalls in backward: a node between two units.
struct SleepInBackward : torch::autograd::Function<SleepInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x, int64_t jitter) {
    ctx->saved_data["jitter"] = jitter;
    return x.view_as(x).clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    reinterpret_cast<Jitter*>(ctx->saved_data["jitter"].toInt())->maybe_sleep();
    return {grads[0], torch::Tensor()};
  }
};

torch::nn::Sequential wide_mlp(int64_t width, Jitter* jitter) {
  torch::manual_seed(1234);
  torch::nn::Sequential m;
  auto sleep = [jitter](torch::Tensor x) {
    if (!jitter) return x;
    jitter->maybe_sleep();
    return SleepInBackward::apply(x, reinterpret_cast<int64_t>(jitter));
  };
  m->push_back(torch::nn::Linear(256, width));
  m->push_back(torch::nn::ReLU());
  for (int i = 0; i < 3; ++i) {
    m->push_back(torch::nn::Functional(sleep));
    m->push_back(torch::nn::Linear(width, width));
    m->push_back(torch::nn::ReLU());
  }
  m->push_back(torch::nn::Functional(sleep));
  m->push_back(torch::nn::Linear(width, 16));
  return m;
}

std::string wide_config(int stage, int64_t width) {
  // Buckets of a quarter of a hidden unit: every unit exceeds them.
  const int64_t bucket = width * width / 4;
  return "train_micro_batch_size_per_gpu = 32\n"
         "[optimizer]\ntype = \"Adam\"\n[optimizer.params]\nlr = 1e-3\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) + "\noverlap_comm = true\n" +
         "reduce_bucket_size = " + std::to_string(bucket) + "\nallgather_bucket_size = " + std::to_string(bucket) +
         "\nstage3_prefetch_bucket_size = " + std::to_string(bucket) + "\n" +
         "[tessera.transport]\ncollective_timeout_ms = 120000\n";
}

Params train_wide(int stage, int64_t width, int steps, Jitter* jitter) {
  auto m = wide_mlp(width, jitter);
  auto e = make_engine(m.ptr(), wide_config(stage, width));
  return train_on(*e, steps, 1, [&](int step, int) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(10000 * step + kRank));
    auto x = at::randn({32, 256}, gen);
    auto y = at::randn({32, 16}, gen);
    return torch::mse_loss(m->forward(x), y);
  });
}

}  // namespace

TEST_CASE("Stage 3 with units of several MiB equals stage 0 on every run, at uneven rank speeds", "[stage3][wide]") {
  const int64_t width = env_or("TESSERA_WIDE_WIDTH", 2048);
  const int runs = int(env_or("TESSERA_WIDE_RUNS", 4));
  const int steps = 4;
  const auto reference = train_wide(0, width, steps, nullptr);
  auto m0 = wide_mlp(width, nullptr);
  expect_all_changed(reference, snapshot_parameters(*m0));  // negative control: training moved every tensor
  for (int run = 0; run < runs; ++run) {
    INFO("run " << run << " of " << runs << ", width " << width);
    Jitter jitter(uint32_t(1000 * run + kRank));
    expect_same(train_wide(3, width, steps, &jitter), reference, 1e-5, kWorld <= 2);
  }
}
