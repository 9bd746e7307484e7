// The ZeRO-3 pieces of the protocol on their own (actors/protocol.h), with real communicators over
// Gloo in real processes (tessera-launch, 1 and 2 ranks), against closed forms:
//  - the stage-3 parameter-shard: fetch / release / gather / window messages, the gathered values,
//    prefetch along the recorded order, the per-kind counters;
//  - UnitGradStaging with the gradient-reducer: chunks through a ring of two slots (chunks made tiny
//    here, so slots are waited for and reclaimed), reduce-scattered into the averaged partition.
// Three units: a (3, 5) in module "m1", b (7,) in "m2", c (4, 4) in "m3". Element e of parameter i
// holds 100 * (i + 1) + e; rank r's gradient of parameter i is (r + 1) * (i + 1) in every element,
// so its average over W ranks is (i + 1) * (W + 1) / 2.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <memory>

#include "actors/actor_runtime.h"
#include "tests/actors/actor_test_support.h"
#include "actors/ask.h"
#include "actors/gradient_reducer.h"
#include "actors/parameter_shard.h"
#include "actors/unit_grad_staging.h"
#include "core/launch_env.h"
#include "core/zero/stage3_parameters.h"
#include "transport/communicator.h"

using namespace tessera;
using namespace tessera::actors;
using namespace tessera::actors::testing;

namespace {


torch::Tensor initial(int i, at::IntArrayRef shape) {
  return (torch::arange(c10::multiply_integers(shape), torch::kFloat) + 100.0f * float(i + 1)).reshape(shape);
}

struct Fixture {
  Fixture() {
    const std::vector<std::vector<int64_t>> shapes{{3, 5}, {7}, {4, 4}};
    std::vector<zero::PlannedParameter> planned;
    for (int i = 0; i < 3; ++i) {
      params.push_back(initial(i, shapes[size_t(i)]).requires_grad_());
      planned.push_back({"p" + std::to_string(i), shapes[size_t(i)], 0, false, "m" + std::to_string(i + 1)});
    }
    zero::ShardingPlanOptions o;
    o.stage = 3, o.world = kWorld, o.sub_group_elements = 1000;  // persistence threshold 0: three units
    auto plan = std::make_shared<const zero::ShardingPlan>(planned, o);
    auto s = std::make_shared<EngineSpec>();
    s->plan = plan, s->rank = kRank, s->world = kWorld, s->timeout = kTimeout;
    s->prefetch_elements = 1000, s->max_live_elements = 1000, s->max_reuse_elements = 0;
    spec = s;
  }
  std::vector<torch::Tensor> params;
  std::shared_ptr<const EngineSpec> spec;
};

void fetch(parameter_shard_actor& shard, int64_t unit, FetchKind kind) {
  checked(ask<Done>(shard, kTimeout, "fetch", fetch_atom::value, FetchRequest{unit, kind, Autocast::off}));
}

Stage3Counters counters(parameter_shard_actor& shard) {
  return checked(ask<Buffers>(shard, kTimeout, "buffers", buffers_atom::value, BufferContents::sizes)).stage3;
}

}  // namespace

TEST_CASE("stage-3 parameter-shard: exact gathers, prefetch along the record, counters per kind", "[actors][stage3]") {
  Fixture f;
  REQUIRE(f.spec->plan->units().size() == 3);
  auto storage = std::make_unique<zero::Stage3Parameters>(*f.spec->plan, kRank, f.params, at::kFloat);
  auto shard = spawn_stage3_parameter_shard(f.spec, std::move(storage), comm("s3_shard"));
  auto expect_gathered = [&](int64_t u) {
    INFO("unit " << u);
    REQUIRE(f.params[size_t(u)].storage().nbytes() > 0);
    CHECK(torch::equal(f.params[size_t(u)], initial(int(u), f.params[size_t(u)].sizes())));
  };
  auto release = [&](int64_t u) {
    caf::anon_send(shard, release_atom::value, ReleaseRequest{u, ReleaseKind::after_use});
  };
  // One window: forwards 0, 1, 2, then backwards 2, 1, 0, each released after its use (reuse
  // distance 0); an update's gather ends it.
  auto window = [&] {
    for (int64_t u : {0, 1, 2}) fetch(shard, u, FetchKind::forward), expect_gathered(u), release(u);
    for (int64_t u : {2, 1, 0}) fetch(shard, u, FetchKind::backward), expect_gathered(u), release(u);
    checked(ask<Done>(shard, kTimeout, "gather", gather_atom::value));
  };
  window();  // recorded: nothing prefetched
  auto first = counters(shard);
  CHECK(first.prefetch_issued == 0);
  CHECK(first.total().fetches == 6);
  CHECK(first.by_kind[size_t(FetchKind::forward)].fetches == 3);
  CHECK(first.by_kind[size_t(FetchKind::backward)].fetches == 3);
  window();  // followed: after F0, units 1 and 2 ahead; after F1, unit 0 (released) for B0; after
             // F2, unit 1 for B1; B2 finds unit 2 released and gathers it on demand
  auto second = counters(shard);
  const auto& fwd = second.by_kind[size_t(FetchKind::forward)];
  const auto& bwd = second.by_kind[size_t(FetchKind::backward)];
  CHECK(fwd.prefetched - first.by_kind[size_t(FetchKind::forward)].prefetched == 2);
  CHECK(bwd.prefetched - first.by_kind[size_t(FetchKind::backward)].prefetched == 2);
  CHECK(second.total().prefetched == fwd.prefetched + bwd.prefetched);
  CHECK(second.divergences == 0);
  // A scope's fetch is outside the order: exact, counted apart, nothing gathered ahead.
  fetch(shard, 1, FetchKind::scope);
  expect_gathered(1);
  auto third = counters(shard);
  CHECK(third.by_kind[size_t(FetchKind::scope)].fetches == 1);
  CHECK(third.prefetch_issued == second.prefetch_issued);
  // Every unit released: no storage left.
  caf::anon_send(shard, release_atom::value, ReleaseRequest{});
  auto buffers = checked(ask<Buffers>(shard, kTimeout, "buffers", buffers_atom::value, BufferContents::tensors));
  CHECK(buffers.gathered_bytes == 0);
  for (const auto& p : f.params) CHECK(p.storage().nbytes() == 0);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
}

TEST_CASE("UnitGradStaging + gradient-reducer: chunks through two slots, averaged into the partition", "[actors][stage3]") {
  Fixture f;
  std::vector<std::unique_ptr<zero::FlatParameters>> no_flat;
  // Chunks of at most 2 elements per rank: many more chunks than slots, so staging waits for slots.
  auto staging = std::make_shared<UnitGradStaging>(f.spec, f.params, 2, 2 * kWorld);
  auto reducer = spawn_gradient_reducer(f.spec, f.params, no_flat, nullptr, staging, comm("s3_reducer"));
  for (int step = 0; step < 2; ++step) {
    INFO("backward " << step);
    {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < f.params.size(); ++i)
        f.params[i].mutable_grad() = torch::full(f.params[i].sizes(), float((kRank + 1) * int(i + 1)));
    }
    caf::anon_send(reducer, begin_atom::value);
    staging->start();
    for (int64_t i : {1, 2, 0}) staging->take(i);  // out of the order (units reversed): 2, then 1 and 0
    staging->take_rest();
    for (const auto& p : f.params) CHECK_FALSE(p.grad().defined());  // every .grad went into the chunks
    caf::anon_send(reducer, flush_atom::value);
    auto ready = checked(ask<GradientsReady>(reducer, kTimeout, "finish", finish_atom::value, FinishRequest{}));
    REQUIRE(ready.partitions.size() == 1);
    // The oracle: this rank's partition of the averaged gradients, laid out by the plan.
    auto expected = torch::zeros({f.spec->plan->groups()[0].layout.partition_numel});
    for (const auto& seg : f.spec->plan->segments()) {
      const auto& layout = seg.layout;
      auto gathered = torch::zeros({layout.padded_numel});
      for (size_t k = 0; k < seg.params.size(); ++k)
        gathered.narrow(0, layout.params[k].offset, layout.params[k].numel)
            .fill_(float(seg.params[k] + 1) * float(kWorld + 1) / 2.0f);
      expected.narrow(0, seg.partition_offset, layout.partition_numel)
          .copy_(gathered.narrow(0, layout.partition_begin(kRank), layout.partition_numel));
    }
    CHECK(torch::equal(ready.partitions[0], expected));
    checked(ask<Done>(reducer, kTimeout, "zero", zero_atom::value));
  }
  caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);
}
