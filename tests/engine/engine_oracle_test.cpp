// The ZeRO engine at stages 0/1/2 against a plain single-process LibTorch oracle that computes
// every rank's micro-batches itself, averages the ranks' gradients ((g_0 + ... + g_W-1) / W, the
// order Gloo's sum-then-divide uses) and steps LibTorch's own optimizer. Run by tessera-launch on
// 2 ranks (bitwise) and 4 ranks (relative difference <= 1e-5: the sum order differs).
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <functional>
#include <map>
#include <atomic>
#include <chrono>
#include <thread>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/data/byte_corpus.h"
#include "core/error.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace {

using namespace tessera::engine_testing;

tessera::nn::GptConfig small_gpt() {
  tessera::nn::GptConfig c;
  c.d_model = 32, c.n_layer = 2, c.n_head = 2, c.context = 16, c.seed = 77;
  return c;  // 41,792 parameters: several reduce buckets, parameters straddling partitions
}

struct Result {
  std::vector<double> losses;       // this rank's micro-batch losses (engine, oracle)
  std::vector<double> mean_losses;  // per micro-step, the mean over all ranks (oracle) / the
                                    // loss of all ranks' sequences at once (full-batch run)
  std::map<std::string, torch::Tensor> params;
};

struct Setup {
  int stage = 0;
  int steps = 4;
  int accumulation = 1;
  int global_batch = 8;  // sequences per micro-step over all ranks
  double clip = 0.0;
  std::string optimizer = R"([optimizer]
type = "AdamW"
[optimizer.params]
lr = 3e-3
weight_decay = 0.01
)";
  std::string scheduler;  // TOML, optional
  int64_t bucket = 5000;  // reduce_bucket_size in elements: several buckets
  bool overlap = false;   // zero_optimization.overlap_comm
  // Stage 3: stage3_param_persistence_threshold. 100 keeps the LayerNorms (32 elements) gathered
  // and partitions every Linear and Embedding (units wte, wpe, c_attn, ..., lm_head).
  int64_t persistence = 100;
  uint64_t seed = 11;
  // Seeded per-rank delays (0-2 ms) before every forward and every gradient-ready event: the
  // ranks' events arrive in different orders and at different times.
  bool jitter = false;

  std::string toml() const {
    return "train_micro_batch_size_per_gpu = " + std::to_string(global_batch / kWorld) +
           "\ngradient_accumulation_steps = " + std::to_string(accumulation) +
           "\ngradient_clipping = " + std::to_string(clip) + "\n" + optimizer + scheduler +
           "[zero_optimization]\nstage = " + std::to_string(stage) + "\noverlap_comm = " + (overlap ? "true" : "false") +
           "\nreduce_bucket_size = " + std::to_string(bucket) +
           (stage == 3 ? "\nstage3_param_persistence_threshold = " + std::to_string(persistence) : std::string()) +
           "\n[tessera.transport]\ncollective_timeout_ms = 60000\n";
  }
};

// A delay of 0-2 ms that depends only on (rank, event, index): the same run replays it.
void jitter_sleep(int64_t event, int64_t index) {
  uint64_t h = 1469598103934665603ull;
  for (uint64_t v : {uint64_t(kRank), uint64_t(event), uint64_t(index)}) h = (h ^ v) * 1099511628211ull;
  std::this_thread::sleep_for(std::chrono::microseconds((h >> 20) % 2500));
}

Result run_engine(const Setup& s) {
  tessera::nn::TinyGpt model(small_gpt());
  auto config = tessera::config::load_config_text(s.toml(), tessera::config::Format::toml, "engine_oracle_test");
  auto engine = tessera::initialize(model.module(), config).engine;
  REQUIRE(engine->world_size() == kWorld);
  auto event = std::make_shared<std::atomic<int64_t>>(0);
  if (s.jitter) {
    // A tensor hook runs on autograd's thread before the gradient is accumulated, so it delays
    // the engine's gradient-ready event of that parameter.
    int64_t i = 0;
    for (auto& p : model.module()->parameters()) {
      p.register_hook([event, i](const torch::Tensor& g) {
        jitter_sleep(event->load(), i);
        return g;
      });
      ++i;
    }
  }
  Result r;
  for (int step = 0; step < s.steps; ++step) {
    for (int micro = 0; micro < s.accumulation; ++micro) {
      if (s.jitter) jitter_sleep(++*event, -1);
      auto batch = corpus().batch(s.seed, step, micro, s.global_batch, 16, kRank, kWorld);
      auto loss = model.loss(batch.tokens, batch.targets);
      engine->backward(loss);
      engine->step();
      r.losses.push_back(loss.item<double>());
    }
  }
  CHECK(engine->global_steps() == s.steps);
  auto gathered = engine->gathered_parameters();  // ZeRO-3: the units are released between steps
  r.params = snapshot_parameters(*model.module());
  return r;
}

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

Result run_oracle(const Setup& s, const OptimizerFactory& make_optimizer,
                  const std::function<double(int64_t)>& lr_at_update = nullptr) {
  tessera::nn::TinyGpt model(small_gpt());
  auto params = model.module()->parameters();
  auto optimizer = make_optimizer(params);
  Result r;
  // Stage 2 across ranks and stage 3 reduce at every micro-step and add the averages; the other
  // stages accumulate locally and reduce once.
  const bool per_micro_step = (s.stage == 2 && kWorld > 1) || s.stage == 3;
  auto micro_loss = [&](int step, int micro, int rank) {
    auto batch = corpus().batch(s.seed, step, micro, s.global_batch, 16, rank, kWorld);
    auto loss = model.loss(batch.tokens, batch.targets);
    (s.accumulation > 1 ? loss / double(s.accumulation) : loss).backward();
    if (rank == kRank) r.losses.push_back(loss.item<double>());
    const size_t at = size_t(step * s.accumulation + micro);
    if (r.mean_losses.size() <= at) r.mean_losses.resize(at + 1, 0.0);
    r.mean_losses[at] += loss.item<double>() / kWorld;
  };
  for (int step = 0; step < s.steps; ++step) {
    std::vector<torch::Tensor> averaged(params.size());
    if (per_micro_step) {
      std::vector<torch::Tensor> accumulated(params.size());
      for (int micro = 0; micro < s.accumulation; ++micro) {
        for (int rank = 0; rank < kWorld; ++rank) {
          for (auto& p : params) p.mutable_grad() = torch::Tensor();
          micro_loss(step, micro, rank);
          for (size_t i = 0; i < params.size(); ++i)
            averaged[i] = rank == 0 ? params[i].grad().clone() : averaged[i].add_(params[i].grad());
        }
        for (size_t i = 0; i < params.size(); ++i) {
          averaged[i].div_(kWorld);
          accumulated[i] = micro == 0 ? averaged[i] : accumulated[i].add_(averaged[i]);
        }
      }
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = accumulated[i];
    } else {
      for (int rank = 0; rank < kWorld; ++rank) {
        for (auto& p : params) p.mutable_grad() = torch::Tensor();
        for (int micro = 0; micro < s.accumulation; ++micro) micro_loss(step, micro, rank);
        for (size_t i = 0; i < params.size(); ++i)
          averaged[i] = rank == 0 ? params[i].grad().clone() : averaged[i].add_(params[i].grad());
      }
      for (size_t i = 0; i < params.size(); ++i) params[i].mutable_grad() = averaged[i].div_(kWorld);
    }
    if (s.clip > 0) torch::nn::utils::clip_grad_norm_(params, s.clip);
    if (lr_at_update)
      for (auto& group : optimizer->param_groups()) group.options().set_lr(lr_at_update(step));
    optimizer->step();
  }
  r.params = snapshot_parameters(*model.module());
  return r;
}

// The plain full-batch run: one backward per micro-step on all ranks' sequences at once.
Result run_full_batch(const Setup& s, const OptimizerFactory& make_optimizer) {
  tessera::nn::TinyGpt model(small_gpt());
  auto params = model.module()->parameters();
  auto optimizer = make_optimizer(params);
  Result r;
  for (int step = 0; step < s.steps; ++step) {
    optimizer->zero_grad();
    for (int micro = 0; micro < s.accumulation; ++micro) {
      auto batch = corpus().batch(s.seed, step, micro, s.global_batch, 16, 0, 1);
      auto loss = model.loss(batch.tokens, batch.targets);
      (s.accumulation > 1 ? loss / double(s.accumulation) : loss).backward();
      r.mean_losses.push_back(loss.item<double>());
    }
    if (s.clip > 0) torch::nn::utils::clip_grad_norm_(params, s.clip);
    optimizer->step();
  }
  r.params = snapshot_parameters(*model.module());
  return r;
}

OptimizerFactory adamw(double lr, double wd) {
  return [=](std::vector<torch::Tensor> ps) {
    return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(lr).weight_decay(wd));
  };
}

// Bitwise at 2 ranks. At other sizes the ranks' gradients are summed in another order than the
// oracle's, and Adam turns the rounding of elements whose gradient nearly cancels across ranks
// into visible update differences; so there the criterion is the relative L2 difference of each
// tensor, ||p - q|| / ||p|| <= 1e-5 (the largest element-wise difference is reported too).
// Parameters always; this rank's losses when `oracle` has them (the full-batch run has none).
void expect_match(const Result& engine, const Result& oracle, bool bitwise_here = kWorld <= 2) {
  if (!oracle.losses.empty()) REQUIRE(engine.losses.size() == oracle.losses.size());
  double worst_l2 = 0, worst_max = 0;
  std::string worst_name;
  for (const auto& [name, p] : oracle.params) {
    const auto& q = engine.params.at(name);
    if (bitwise_here) {
      INFO(name << " max |diff| " << (p - q).abs().max().item<double>());
      CHECK(torch::equal(p, q));
    }
    const double l2 = (p - q).norm().item<double>() / p.norm().item<double>();
    if (l2 > worst_l2) worst_l2 = l2, worst_name = name;
    worst_max = std::max(worst_max, (p - q).abs().max().item<double>() / p.abs().max().item<double>());
  }
  for (size_t i = 0; i < oracle.losses.size(); ++i) {
    INFO("loss of micro-step " << i << ": " << engine.losses[i] << " vs " << oracle.losses[i]);
    if (bitwise_here) CHECK(engine.losses[i] == oracle.losses[i]);
    CHECK(std::abs(engine.losses[i] - oracle.losses[i]) <= 1e-5 * std::abs(oracle.losses[i]));
  }
  INFO("largest relative L2 difference " << worst_l2 << " in " << worst_name
                                           << "; largest element-wise relative difference " << worst_max);
  CHECK(worst_l2 <= 1e-5);
}

}  // namespace

TEST_CASE("Stages 0, 1, 2, 3 equal the single-process oracle and the full-batch run (AdamW, 20 steps)",
          "[engine]") {
  Setup s;
  s.steps = 20;
  auto oracle = run_oracle(s, adamw(3e-3, 0.01));
  auto full = run_full_batch(s, adamw(3e-3, 0.01));
  // The full-batch loss is the mean of the ranks' losses (equal shares, mean over tokens), up to
  // rounding: an independent check of the oracle's per-rank batches.
  REQUIRE(full.mean_losses.size() == oracle.mean_losses.size());
  for (size_t i = 0; i < full.mean_losses.size(); ++i)
    CHECK(std::abs(full.mean_losses[i] - oracle.mean_losses[i]) <= 1e-5 * std::abs(full.mean_losses[i]));
  for (int stage : {0, 1, 2, 3}) {
    for (bool overlap : {false, true}) {
      s.stage = stage;
      s.overlap = overlap;
      INFO("stage " << stage << " overlap_comm " << overlap << " world " << kWorld);
      auto engine = run_engine(s);
      expect_match(engine, oracle);
      INFO("against the full-batch run (parameters)");
      expect_match(engine, full, false);
    }
  }
}

TEST_CASE("Seeded per-rank delays before every forward and gradient-ready event change no bit and hang nothing",
          "[engine][timing]") {
  // One issuer per communicator, in plan order: whatever order and timing autograd reports in on
  // each rank, the same collectives run in the same order, and the results stay the oracle's.
  Setup s;
  s.steps = 6;
  s.jitter = true;
  s.overlap = true;
  s.bucket = 3000;  // many buckets: many events to reorder
  auto oracle = run_oracle(s, adamw(3e-3, 0.01));
  for (int stage : {0, 1, 2, 3}) {
    for (int accumulation : {1, 2}) {
      s.stage = stage;
      s.accumulation = accumulation;
      INFO("stage " << stage << " accumulation " << accumulation << " world " << kWorld);
      auto expected = accumulation == 1 ? oracle : run_oracle(s, adamw(3e-3, 0.01));
      expect_match(run_engine(s), expected);
    }
  }
}

TEST_CASE("reduce_bucket_size 0 reduces each parameter on its own, as DeepSpeed, and equals the oracle", "[engine]") {
  Setup s;
  s.steps = 3;
  s.bucket = 0;  // one bucket per parameter (stage 2: also cut at the partitions)
  auto oracle = run_oracle(s, adamw(3e-3, 0.01));
  for (int stage : {0, 1, 2, 3}) {
    s.stage = stage;
    INFO("stage " << stage << " world " << kWorld);
    expect_match(run_engine(s), oracle);
  }
}

TEST_CASE("Gradient accumulation over 3 micro-steps equals the oracle", "[engine]") {
  // Stage 2 reduces every micro-step (DeepSpeed's order: average per micro-step, then sum); its
  // oracle does the same, and both stay within the tolerance of the other order.
  Setup s;
  s.accumulation = 3;
  s.steps = 3;
  s.stage = 1;
  auto oracle = run_oracle(s, adamw(3e-3, 0.01));
  expect_match(run_engine(s), oracle);
  s.stage = 2;
  auto per_micro_step = run_oracle(s, adamw(3e-3, 0.01));
  INFO("stage 2");
  expect_match(run_engine(s), per_micro_step);
  INFO("stage 2 against the reduce-once order");
  expect_match(run_engine(s), oracle, false);
  s.stage = 3;
  INFO("stage 3 (reduce-scatter every micro-step, as stage 2)");
  expect_match(run_engine(s), per_micro_step);
}

TEST_CASE("Clipping by the global norm (stages 0/1 bitwise, stages 2/3 within 1e-5)", "[engine]") {
  Setup s;
  s.clip = 0.05;  // small enough to clip every step
  auto oracle = run_oracle(s, adamw(3e-3, 0.01));
  for (int stage : {0, 1, 2, 3}) {
    s.stage = stage;
    INFO("stage " << stage);
    expect_match(run_engine(s), oracle, kWorld <= 2 && stage < 2);
  }
}

TEST_CASE("SGD with momentum and a WarmupLR schedule equal the oracle", "[engine]") {
  Setup s;
  s.stage = 2;
  s.optimizer = R"([optimizer]
type = "SGD"
[optimizer.params]
lr = 0.1
momentum = 0.9
)";
  s.scheduler = R"([scheduler]
type = "WarmupLR"
[scheduler.params]
warmup_min_lr = 0.01
warmup_max_lr = 0.1
warmup_num_steps = 3
warmup_type = "linear"
)";
  // DeepSpeed's index convention: update u runs with lr_at(u - 1); lr_at(-1) = min, lr_at(k) =
  // min + (max - min) * k / 3 during warm-up.
  auto lr_at_update = [](int64_t u) { return u == 0 ? 0.01 : 0.01 + 0.09 * std::min<double>(1.0, (u - 1) / 3.0); };
  auto oracle = run_oracle(s, [](std::vector<torch::Tensor> ps) {
    return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(0.1).momentum(0.9));
  }, lr_at_update);
  expect_match(run_engine(s), oracle);
}

TEST_CASE("Bad settings are refused before the model changes", "[engine]") {
  tessera::nn::TinyGpt model(small_gpt());
  auto before = snapshot_parameters(*model.module());
  auto load = [](const std::string& text) {
    return tessera::config::load_config_text("train_micro_batch_size_per_gpu = 2\n" + text,
                                             tessera::config::Format::toml, "bad.toml");
  };
  const std::string opt = "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-3\n";
  CHECK_THROWS_WITH(tessera::initialize(model.module(),
                                        load("[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = -1\n" + opt)),
                    Catch::Contains("stage3_param_persistence_threshold"));
  CHECK_THROWS_WITH(
      tessera::initialize(model.module(), load(opt + "[zero_optimization]\nstage = 3\n[zero_optimization.offload_optimizer]\n"
                                                      "device = \"nvme\"\nnvme_path = \"/tmp\"\nratio = 0.5\n")),
      Catch::Contains("zero_optimization.offload_optimizer.ratio = 0.5: not yet supported (partial optimizer offload to NVMe"));
  CHECK_THROWS_WITH(
      tessera::initialize(model.module(),
                          load(opt + "[zero_optimization]\nstage = 0\n[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n")),
      Catch::Contains("offload_optimizer.device") && Catch::Contains("stage 1, 2 or 3"));
  CHECK_THROWS_WITH(tessera::initialize(model.module(), load("[fp16]\nenabled = true\n[bf16]\nenabled = true\n" + opt)),
                    Catch::Contains("fp16") && Catch::Contains("bf16"));
  CHECK_THROWS_WITH(tessera::initialize(model.module(), load("[zero_optimization]\nstage = 1\n")),
                    Catch::Contains("optimizer"));
  CHECK_THROWS_WITH(tessera::initialize(model.module(), load("[data_types]\ngrad_accum_dtype = \"bf16\"\n" + opt)),
                    Catch::Contains("data_types.grad_accum_dtype") && Catch::Contains("trains in fp32"));
  auto after = snapshot_parameters(*model.module());
  for (auto& [name, p] : before) CHECK(torch::equal(p, after[name]));
}

TEST_CASE("A second backward in the boundary micro-step is an error", "[engine]") {
  tessera::nn::TinyGpt model(small_gpt());
  Setup s;
  auto engine = tessera::initialize(
      model.module(), tessera::config::load_config_text(s.toml(), tessera::config::Format::toml, "t")).engine;
  auto batch = corpus().batch(1, 0, 0, s.global_batch, 16, kRank, kWorld);
  engine->backward(model.loss(batch.tokens, batch.targets));
  CHECK_THROWS_WITH(engine->backward(model.loss(batch.tokens, batch.targets)), Catch::Contains("called twice"));
  engine->step();
  CHECK(engine->global_steps() == 1);
  CHECK_THROWS_WITH(engine->backward(torch::ones({2}, torch::requires_grad())), Catch::Contains("scalar"));
}

TEST_CASE("Stage 2 keeps only this rank's gradient partition; stages 0/1 keep the whole", "[engine][memory]") {
  Setup s;
  std::map<int, int64_t> gradient_bytes;
  // DeepSpeed pads the group to a multiple of 2 x world; each rank owns padded / world elements.
  const int64_t padded = (tessera::nn::gpt_parameter_count(small_gpt()) + 2 * kWorld - 1) / (2 * kWorld) * 2 * kWorld;
  for (int stage : {1, 2}) {
    s.stage = stage;
    tessera::nn::TinyGpt model(small_gpt());
    auto engine = tessera::initialize(model.module(), tessera::config::load_config_text(s.toml(), tessera::config::Format::toml, "m")).engine;
    auto batch = corpus().batch(1, 0, 0, s.global_batch, 16, kRank, kWorld);
    engine->backward(model.loss(batch.tokens, batch.targets));
    const auto memory = engine->memory();
    gradient_bytes[stage] = memory.gradients;
    CHECK(memory.parameters == padded * 4);
    if (stage == 2 && kWorld > 1) {
      // Every .grad was copied into a reduction and released.
      for (auto& p : model.module()->parameters()) CHECK_FALSE(p.grad().defined());
    }
    // Scratch: the clipping norm's double buffer (at most 2^20 elements of the partition). fp32 AdamW
    // runs the fused kernel (core/optim/fused_adam.h), which needs no temporary after the first step
    // either; the ATen path would hold one partition-sized denominator.
    const int64_t norm_scratch = 8 * std::min<int64_t>(padded / kWorld, int64_t(1) << 20);
    CHECK(memory.scratch == norm_scratch);
    engine->step();
    const auto after = engine->memory();
    CHECK(after.optimizer_states == 2 * 4 * padded / kWorld);  // AdamW: exp_avg, exp_avg_sq
    CHECK(after.scratch == norm_scratch);
    CHECK(after.total() == after.parameters + after.gradients + after.master + after.optimizer_states + after.scratch);
  }
  CHECK(gradient_bytes[1] == padded * 4);
  // Stage 2 across ranks: the partition plus the staging ring (2 buckets of reduce_bucket_size).
  CHECK(gradient_bytes[2] == (kWorld > 1 ? padded / kWorld * 4 + 2 * s.bucket * 4 : padded * 4));
}
