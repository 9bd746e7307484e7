// ZeRO stage 3 against independent oracles: its memory computed from the parameter shapes and the
// layout rules (core/zero/unit_layout.h), storage-level release checked through storage().nbytes(),
// the refusal of modules no tessera::Unit holder calls, and training (parameter groups, no_sync,
// coalesce_grad_reduction, bf16/fp16/autocast, two engines, accumulation) against stage 2 and
// LibTorch (storage maps and gathered_parameters() scopes: engine_stage3_scopes_test.cpp). Bitwise at <= 2 ranks; at 4, relative L2 <= 1e-5 (bf16/fp16: 2e-3): stage 2 reduces
// buckets to owners and stage 3 reduce-scatters segments, which may sum 4 ranks in another order.
// A released parameter has no memory: every read of one here is inside gathered_parameters().
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "actors/engine/engine.h"
#include "core/nn/tiny_gpt.h"
#include "core/zero/unit_holder.h"
#include "tests/engine/stage3_test_support.h"

namespace {

using namespace tessera::stage3_testing;

// unit_layout.h's rules re-derived from the shapes: a unit is the module owning its parameters;
// each segment (one flat group here) is padded to a multiple of 2 * W and cut into W pieces; the
// partition is every piece, the weight buffer the partition plus the persistent copy.
struct Layout {
  int64_t partition = 0, persistent_padded = 0, units_gathered = 0;  // elements
  int64_t persistent = 0, units = 0;                                 // persistent elements, units
  int64_t staging_bytes = 0;  // the gradient staging ring (unit_grad_staging.h): 2 slots of the largest
                              // chunk (here a whole segment: all are below the chunk size) and its
                              // piece, the piece on a 64-byte boundary
};

Layout expected_layout(torch::nn::Module& m, int64_t threshold) {
  auto padded = [](int64_t n) { return (n + 2 * kWorld - 1) / (2 * kWorld) * 2 * kWorld; };
  std::vector<std::string> order;
  std::map<std::string, int64_t> unit_numel;
  Layout l;
  for (auto& item : m.named_parameters()) {
    const auto n = item.value().numel();
    const auto module = item.key().substr(0, item.key().rfind('.'));  // (TinyGpt has no root parameter)
    if (n <= threshold) {
      l.persistent += n;
      continue;
    }
    if (!unit_numel.count(module)) order.push_back(module);
    unit_numel[module] += n;
  }
  l.persistent_padded = padded(l.persistent);
  l.partition = l.persistent_padded / kWorld;
  for (const auto& u : order) l.partition += padded(unit_numel[u]) / kWorld, l.units_gathered += padded(unit_numel[u]);
  l.units = int64_t(order.size());
  auto aligned = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
  int64_t largest = l.persistent_padded;
  for (const auto& u : order) largest = std::max(largest, padded(unit_numel[u]));
  l.staging_bytes = 2 * (aligned(4 * largest) + 4 * largest / kWorld);
  return l;
}

// fp16: LibTorch 1.13 has no fp16 matmul on CPU, so the weights are upcast in forward (as in
// engine_precision_test.cpp), here inside Unit-held modules so that stage 3 gathers fp16 units.
struct UpcastLinearImpl : torch::nn::Module {
  UpcastLinearImpl(int64_t in, int64_t out) {
    weight = register_parameter("weight", torch::randn({out, in}) * 0.3);
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::nn::functional::linear(x, weight.to(torch::kFloat), bias.to(torch::kFloat));
  }
  torch::Tensor weight, bias;
};
TORCH_MODULE(UpcastLinear);

// A regression MLP of two Layers: stock torch::nn::Linear (no tessera::Unit holder calls them) or
// Unit-held UpcastLinear. The last rank's loss at `overflow_step` is huge (inf fp16 gradients).
template <class Layer>
struct Mlp : torch::nn::Module {
  Mlp(uint64_t seed, int64_t hidden) {
    torch::manual_seed(seed);
    fc1 = register_module("fc1", Layer(8, hidden));
    fc2 = register_module("fc2", Layer(hidden, 1));
  }
  torch::Tensor loss(int step, int rank) {
    auto x = at::randn({8, 8}, at::make_generator<at::CPUGeneratorImpl>(1000 * step + rank));
    auto loss = (fc2(torch::tanh(fc1(x))) - torch::sin(x.sum(1, true))).pow(2).mean();
    return step == overflow_step && rank == kWorld - 1 ? loss * 1e30 : loss;
  }
  Params train(tessera::Engine& e, int steps) {
    return train_on(e, steps, 1, [&](int step, int) { return loss(step, kRank); });
  }
  Layer fc1{nullptr}, fc2{nullptr};
  int overflow_step = -1;
};
// fc1.weight (192 elements) is a unit at threshold 100; fc1.bias and fc2's 24 + 1 are persistent.
std::shared_ptr<Mlp<torch::nn::Linear>> plain_mlp() { return std::make_shared<Mlp<torch::nn::Linear>>(3, 24); }
using Fp16Mlp = Mlp<tessera::Unit<UpcastLinear>>;

}  // namespace

TEST_CASE("Stage 3 holds 1/W of the units plus the persistent copy; released units have no memory",
          "[engine][stage3][memory]") {
  // The tests' small GPT (every segment a multiple of 8) and an odd width (33: segments padded).
  tessera::nn::GptConfig odd = gpt();
  odd.d_model = 33, odd.n_head = 3;
  for (const auto& c : {gpt(), odd}) {
    INFO("d_model " << c.d_model << " world " << kWorld);
    tessera::nn::TinyGpt m(c);
    const auto layout = expected_layout(*m.module(), 100);
    const int64_t total = tessera::nn::gpt_parameter_count(c);
    REQUIRE(layout.units == 2 + 4 * c.n_layer + 1);  // wte, wpe, 4 Linears per block, lm_head
    auto e = make_engine(m.module(), config_text(3, 100));
    const auto between = layout.partition + layout.persistent_padded;
    CHECK(e->memory().parameters == 4 * between);
    // About 1/W of the model plus the persistent parameters (each piece pads by < 2 elements).
    CHECK(between <= total / kWorld + layout.persistent + 2 * (layout.units + 1) + layout.persistent_padded);
    expect_released(*e, 100, true);
    {
      auto scope = e->gathered_parameters();
      expect_released(*e, 100, false);
      CHECK(e->memory().parameters == 4 * (between + layout.units_gathered));
    }
    expect_released(*e, 100, true);
    e->backward(rank_loss(m, 0, 0, kRank));
    for (auto& p : m.module()->parameters()) CHECK_FALSE(p.grad().defined());  // all went to reduce-scatters
    e->step();
    expect_released(*e, 100, true);
    const auto after = e->memory();
    CHECK(after.parameters == 4 * between);
    CHECK(after.gradients == 4 * layout.partition + layout.staging_bytes);
    CHECK(after.master == 0);  // fp32: the master is the weights' partition
    CHECK(after.optimizer_states == 2 * 4 * layout.partition);
    // Stage 2 holds the whole padded group and releases nothing (the control for the nbytes checks).
    tessera::nn::TinyGpt m2(c);
    auto e2 = make_engine(m2.module(), config_text(2));
    expect_released(*e2, 100, false);
    const int64_t stage2 = e2->memory().parameters;
    CHECK(stage2 == 4 * ((total + 2 * kWorld - 1) / (2 * kWorld) * 2 * kWorld));
    if (kWorld > 1) CHECK(after.parameters < stage2);
  }
}

TEST_CASE("Plain torch::nn::Linear modules are refused at stage 3, naming them, and the model is untouched",
          "[engine][stage3]") {
  auto model = plain_mlp();
  const auto before = snapshot_parameters(*model);
  std::map<std::string, const void*> addresses;
  for (auto& item : model->named_parameters()) addresses[item.key()] = item.value().data_ptr();
  CHECK_THROWS_WITH(make_engine(model, config_text(3, 100)),
                    Catch::Contains("'fc1'") && Catch::Contains("tessera::Unit") && !Catch::Contains("'fc2'") &&
                        Catch::Contains("stage3_param_persistence_threshold"));
  for (auto& item : model->named_parameters()) {
    INFO(item.key());
    CHECK(item.value().data_ptr() == addresses.at(item.key()));  // not rebound
    CHECK(torch::equal(item.value(), before.at(item.key())));
  }
  // Everything persistent (threshold above every parameter): no unit needs a holder, and training
  // equals stage 2 and LibTorch's AdamW on the averaged gradients.
  auto stage3 = make_engine(model, config_text(3, 1000));
  expect_released(*stage3, 1000, false);
  const auto got = model->train(*stage3, 5);
  auto reference = plain_mlp();
  expect_same(got, reference->train(*make_engine(reference, config_text(2)), 5));
  auto oracle = plain_mlp();
  torch::optim::AdamW adamw(oracle->parameters(), adamw_options());
  expect_same(got, oracle_run(*oracle, adamw, 5, [&](int step, int rank) { oracle->loss(step, rank).backward(); }));
  expect_all_changed(got, before);
  // A parameter the root module owns is named so.
  struct Root : torch::nn::Module {
    Root() { w = register_parameter("w", torch::ones({20, 10})); }
    torch::Tensor w;
  };
  auto root = std::make_shared<Root>();
  CHECK_THROWS_WITH(make_engine(root, config_text(3, 100)), Catch::Contains("(the root module)"));
  CHECK(torch::equal(root->w, torch::ones({20, 10})));
}

TEST_CASE("Two parameter groups at stage 3 equal stage 2 and LibTorch's AdamW with those groups",
          "[engine][stage3][groups]") {
  // Group 1 (own lr, no decay): the vectors (persistent) and lm_head (a unit); group 0 the rest. At
  // threshold 600 wpe (512) is persistent in group 0: both groups have a persistent segment.
  auto in_group_1 = [](const std::string& name, const torch::Tensor& p) {
    return p.dim() < 2 || name == "lm_head.weight";
  };
  std::map<int, Params> results;
  for (int stage : {2, 3}) {
    tessera::nn::TinyGpt m(gpt());
    tessera::InitializeOptions options;
    options.param_groups.resize(2);
    for (auto& item : m.module()->named_parameters())
      options.param_groups[in_group_1(item.key(), item.value()) ? 1 : 0].names.push_back(item.key());
    options.param_groups[1].lr = 1e-3;
    options.param_groups[1].weight_decay = 0.0;
    auto e = make_engine(m.module(), config_text(stage, 600), options);
    REQUIRE(e->num_param_groups() == 2);
    CHECK(e->get_lrs() == std::vector<double>{3e-3, 1e-3});
    results[stage] = train(m, *e, 5);
  }
  INFO("stage 3 against stage 2");
  expect_same(results[3], results[2]);
  tessera::nn::TinyGpt oracle(gpt());
  const auto initial = snapshot_parameters(*oracle.module());
  std::vector<torch::Tensor> g0, g1;
  for (auto& item : oracle.module()->named_parameters())
    (in_group_1(item.key(), item.value()) ? g1 : g0).push_back(item.value());
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(g0, std::make_unique<torch::optim::AdamWOptions>(adamw_options()));
  groups.emplace_back(g1, std::make_unique<torch::optim::AdamWOptions>(adamw_options(1e-3, 0.0)));
  torch::optim::AdamW adamw(groups, adamw_options());
  INFO("stage 3 against LibTorch's AdamW");
  expect_same(results[3], oracle_run(*oracle.module(), adamw, 5,
                                     [&](int step, int rank) { rank_loss(oracle, step, 0, rank).backward(); }));
  expect_all_changed(results[3], initial);
}

TEST_CASE("no_sync and coalesce_grad_reduction at stage 3 equal stage 2 with the same calls",
          "[engine][stage3][scopes]") {
  // Per step: three backwards in one coalesce block, or two in no_sync then a reducing one. Both
  // equal one reduction of every rank's three gradients summed in .grad.
  auto run = [](int stage, bool coalesce) {
    tessera::nn::TinyGpt m(gpt());
    auto e = make_engine(m.module(), config_text(stage));
    for (int step = 0; step < 3; ++step) {
      if (coalesce) {
        auto block = e->coalesce_grad_reduction();
        for (int chunk = 0; chunk < 3; ++chunk) e->backward(rank_loss(m, step, chunk, kRank));
        CHECK_THROWS_WITH(e->step(), Catch::Contains("inside coalesce_grad_reduction"));
      } else {
        {
          auto block = e->no_sync();
          e->backward(rank_loss(m, step, 0, kRank));
          e->backward(rank_loss(m, step, 1, kRank));
          expect_released(*e, 100, stage == 3);
        }
        e->backward(rank_loss(m, step, 2, kRank));
      }
      e->step();
    }
    return gathered_snapshot(*e);
  };
  tessera::nn::TinyGpt oracle(gpt());
  torch::optim::AdamW adamw(oracle.module()->parameters(), adamw_options());
  const auto expected = oracle_run(*oracle.module(), adamw, 3, [&](int step, int rank) {
    for (int chunk = 0; chunk < 3; ++chunk) rank_loss(oracle, step, chunk, rank).backward();
  });
  for (bool coalesce : {true, false}) {
    INFO((coalesce ? "coalesce_grad_reduction" : "no_sync"));
    const auto stage3 = run(3, coalesce);
    expect_same(stage3, run(2, coalesce));
    expect_same(stage3, expected);
  }
  // Coalesced blocks at both micro-steps of accumulation 2, each added into the partition.
  auto accumulated = [](int stage) {
    tessera::nn::TinyGpt m(gpt());
    auto e = make_engine(m.module(), config_text(stage, 100, 2));
    for (int step = 0; step < 2; ++step)
      for (int micro = 0; micro < 2; ++micro) {
        {
          auto block = e->coalesce_grad_reduction();
          e->backward(rank_loss(m, step, 2 * micro, kRank));
          e->backward(rank_loss(m, step, 2 * micro + 1, kRank));
        }
        e->step();
      }
    return gathered_snapshot(*e);
  };
  // Bitwise at 2 ranks only: one rank's stage 2 sums all four backwards in .grad and reduces once.
  INFO("coalesced blocks, accumulation 2");
  expect_same(accumulated(3), accumulated(2), 1e-5, kWorld == 2);
}

TEST_CASE("Eval forwards under NoGradGuard and InferenceMode give the exact logits and release every unit",
          "[engine][stage3]") {
  tessera::nn::TinyGpt m(gpt()), untouched(gpt());
  auto e = make_engine(m.module(), config_text(3));
  const auto tokens = corpus().batch(99, 0, 0, 8, 16, kRank, kWorld).tokens;
  auto logits_of = [&](tessera::nn::TinyGpt& model, bool inference) {
    if (inference) {
      torch::InferenceMode guard;
      return model.forward(tokens);
    }
    torch::NoGradGuard guard;
    return model.forward(tokens);
  };
  const int64_t between = e->memory().parameters;
  auto check = [&](const std::string& when) {
    for (bool inference : {false, true}) {
      INFO((inference ? "InferenceMode " : "NoGradGuard ") << when);
      CHECK(torch::equal(logits_of(m, inference), logits_of(untouched, inference)));
      expect_released(*e, 100, true);
      CHECK(e->memory().parameters == between);
    }
  };
  e->eval();
  check("at the start");
  {
    // Forwards inside a gathered_parameters() scope release nothing it holds; nor does an inner scope's end.
    auto scope = e->gathered_parameters();
    CHECK(torch::equal(logits_of(m, false), logits_of(untouched, false)));
    expect_released(*e, 100, false);
    { auto inner = e->gathered_parameters({"lm_head.weight"}); }
    expect_released(*e, 100, false);
  }
  // After training, against a plain model holding the gathered weights.
  e->train();
  const auto weights = train(m, *e, 2);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : untouched.module()->named_parameters()) item.value().copy_(weights.at(item.key()));
  }
  e->eval();
  check("after 2 steps");
}

TEST_CASE("bf16 with fp32 master at stage 3 equals stage 2; bf16 units are released too", "[engine][stage3][bf16]") {
  const std::string bf16 = "[bf16]\nenabled = true\n";
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3, 100, 1, bf16));
  const auto layout = expected_layout(*m.module(), 100);
  CHECK(e->memory().parameters == 2 * (layout.partition + layout.persistent_padded));
  const auto stage3 = train(m, *e, 4);
  expect_released(*e, 100, true);
  CHECK(e->memory().master == 4 * layout.partition);
  for (const auto& [name, p] : stage3) CHECK(p.scalar_type() == torch::kBFloat16);
  expect_same(stage3, run_gpt(2, 100, 4, 1, bf16), 2e-3);
}

TEST_CASE("fp16 at stage 3 (fp16 units) equals stage 2: static scale, and one rank's overflow skipping a step",
          "[engine][stage3][fp16]") {
  const std::string fixed = "[fp16]\nenabled = true\nloss_scale = 1024\n";
  const std::string dynamic =
      "[fp16]\nenabled = true\ninitial_scale_power = 10\nhysteresis = 1\nloss_scale_window = 100\n";
  for (int overflow_step : {-1, 2}) {
    INFO("overflow at step " << overflow_step);
    auto run = [&](int stage) {
      auto m = std::make_shared<Fp16Mlp>(5, 16);
      m->overflow_step = overflow_step;
      // Threshold 10: units fc1 (weight 128, bias 16) and fc2 (weight 16); fc2.bias (1) is persistent.
      auto e = make_engine(m, config_text(stage, 10, 1, overflow_step < 0 ? fixed : dynamic));
      auto out = m->train(*e, 5);
      CHECK(e->skipped_steps() == (overflow_step < 0 ? 0 : 1));
      CHECK(e->loss_scale() == (overflow_step < 0 ? 1024.0 : 512.0));
      if (stage == 3) expect_released(*e, 10, true);
      return out;
    };
    const auto stage3 = run(3);
    for (const auto& [name, p] : stage3) CHECK(p.scalar_type() == torch::kHalf);
    expect_same(stage3, run(2), 2e-3);
  }
}

TEST_CASE("torch_autocast (Linear gradients reduced in bf16) at stage 3 equals stage 2", "[engine][stage3][autocast]") {
  // Two flat groups (Linear weights reduced in bf16, the rest in fp32), each with its own units.
  const std::string autocast = "[torch_autocast]\nenabled = true\ndtype = \"bfloat16\"\n";
  expect_same(run_gpt(3, 100, 4, 1, autocast), run_gpt(2, 100, 4, 1, autocast));
}

TEST_CASE("Two stage-3 engines in one process (a policy and a copy of it) train like two single-engine runs",
          "[engine][stage3][multi]") {
  const auto expected_a = run_gpt(3, 100, 3, 1, "", 7), expected_b = run_gpt(3, 100, 3, 1, "", 8);
  tessera::nn::TinyGpt a(gpt()), b(gpt());  // b starts as a copy of a
  auto ea = make_engine(a.module(), config_text(3)), eb = make_engine(b.module(), config_text(3));
  const auto tokens = corpus().batch(99, 0, 0, 8, 16, kRank, kWorld).tokens;
  for (int step = 0; step < 3; ++step) {
    auto la = rank_loss(a, step, 0, kRank, 7);
    {
      torch::NoGradGuard no_grad;  // b's reference forward between a's forward and backward (GRPO's KL)
      (void)b.forward(tokens);
    }
    auto lb = rank_loss(b, step, 0, kRank, 8);
    ea->backward(la);
    eb->backward(lb);
    ea->step();
    eb->step();
  }
  expect_released(*ea, 100, true);
  expect_released(*eb, 100, true);
  const auto got_a = gathered_snapshot(*ea), got_b = gathered_snapshot(*eb);
  // The same engine code and collectives as the single runs: bitwise at every size.
  for (const auto& [name, p] : expected_a) {
    INFO(name);
    CHECK(torch::equal(got_a.at(name), p));
    CHECK(torch::equal(got_b.at(name), expected_b.at(name)));
  }
  expect_all_changed(got_a, snapshot_parameters(*tessera::nn::TinyGpt(gpt()).module()));
  expect_all_changed(got_b, got_a);  // other data
}

TEST_CASE("A joint loss over a stage-3 and a stage-2 engine with a plain loss.backward() equals two stage-2 engines",
          "[engine][stage3][multi]") {
  auto run = [](int stage_a) {
    tessera::nn::TinyGpt a(gpt(41)), b(gpt(42));
    auto ea = make_engine(a.module(), config_text(stage_a)), eb = make_engine(b.module(), config_text(2));
    for (int step = 0; step < 3; ++step) {
      (rank_loss(a, step, 0, kRank) + rank_loss(b, step, 0, kRank) / 2).backward();
      ea->step();
      eb->step();
    }
    auto out = gathered_snapshot(*ea);
    for (const auto& [name, p] : snapshot_parameters(*b.module())) out["b." + name] = p;
    return out;
  };
  expect_same(run(3), run(2));
}

TEST_CASE("Accumulation 2 with the default threshold (every parameter persistent, no unit) equals stage 2",
          "[engine][stage3]") {
  tessera::nn::TinyGpt m(gpt());
  auto e = make_engine(m.module(), config_text(3, /*default*/ -1, 2));
  const int64_t padded = (tessera::nn::gpt_parameter_count(gpt()) + 2 * kWorld - 1) / (2 * kWorld) * 2 * kWorld;
  CHECK(e->memory().parameters == 4 * (padded / kWorld + padded));  // partition + the persistent copy
  const auto stage3 = train(m, *e, 3, 2);
  expect_released(*e, 100000, false);
  expect_same(stage3, run_gpt(2, -1, 3, 2));
}

TEST_CASE("Units with a persistent bias beside a partitioned weight, and frozen biases, at stage 3 equal stage 2",
          "[engine][stage3]") {
  // With Linear biases, c_proj.bias (32) is persistent while its weight is partitioned, c_fc.bias
  // (128) shares its unit's segment; c_attn.bias is frozen, so in no plan (its key third would also
  // turn summation-order noise into Adam updates).
  tessera::nn::GptConfig c = gpt();
  c.bias = true;
  auto run = [&](int stage) {
    tessera::nn::TinyGpt m(c);
    for (auto& item : m.module()->named_parameters())
      if (item.key().find("c_attn.bias") != std::string::npos) item.value().set_requires_grad(false);
    auto e = make_engine(m.module(), config_text(stage));
    const auto out = train(m, *e, 4);
    auto frozen = m.module()->named_parameters()["h.1.attn.c_attn.bias"];
    CHECK(frozen.storage().nbytes() == 96 * 4);
    CHECK(torch::equal(frozen, torch::zeros({96})));
    return out;
  };
  expect_same(run(3), run(2));
}
