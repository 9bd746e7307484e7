// The protocol of each actor on its own (actors/protocol.h), with real communicators over Gloo in
// real processes (tessera-launch, 1 and 2 ranks): the messages each actor takes and what its
// replies hold, against closed forms. Rank r's gradient of parameter i is (r + 1) * (i + 1) in
// every element, so the average over W ranks is (i + 1) * (W + 1) / 2.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <memory>

#include "actors/actor_runtime.h"
#include "tests/actors/actor_test_support.h"
#include "actors/ask.h"
#include "actors/bucket_staging.h"
#include "actors/gradient_reducer.h"
#include "actors/optimizer_shard.h"
#include "actors/parameter_shard.h"
#include "core/optim/optimizer_kernel.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"

using namespace tessera;
using namespace tessera::actors;
using namespace tessera::actors::testing;

namespace {


// Two parameters a (3, 5) and b (7,): 22 elements, partitions straddle a.
struct Fixture {
  explicit Fixture(int stage, int64_t bucket = 8) {
    a = torch::zeros({3, 5}).requires_grad_();
    b = torch::zeros({7}).requires_grad_();
    zero::ShardingPlanOptions o;
    o.stage = stage, o.world = kWorld, o.bucket_elements = bucket, o.sub_group_elements = 5;
    auto plan = std::make_shared<const zero::ShardingPlan>(
        std::vector<zero::PlannedParameter>{{"a", {3, 5}, 0, false}, {"b", {7}, 0, false}}, o);
    auto s = std::make_shared<EngineSpec>();
    s->plan = plan, s->rank = kRank, s->world = kWorld, s->timeout = kTimeout, s->overlap_comm = true;
    spec = s;
    flat.push_back(std::make_unique<zero::FlatParameters>(
        std::vector<std::pair<std::string, at::Tensor>>{{"a", a}, {"b", b}}, plan->groups()[0].layout));
  }
  const zero::FlatGroupLayout& layout() const { return spec->plan->groups()[0].layout; }
  // The closed-form average gradient of flat element e (padding: 0).
  float average(int64_t e) const {
    if (e >= layout().numel) return 0.0f;
    const int i = e < 15 ? 0 : 1;
    return float(i + 1) * float(kWorld + 1) / 2.0f;
  }
  void set_gradients() {
    torch::NoGradGuard no_grad;
    for (int i = 0; i < 2; ++i) {
      auto& p = i == 0 ? a : b;
      if (p.grad().defined()) p.mutable_grad().fill_(float((kRank + 1) * (i + 1)));
      else p.mutable_grad() = torch::full(p.sizes(), float((kRank + 1) * (i + 1)));
    }
  }
  torch::Tensor a, b;
  std::shared_ptr<const EngineSpec> spec;
  std::vector<std::unique_ptr<zero::FlatParameters>> flat;
};

}  // namespace

TEST_CASE("parameter-shard: partitions are lent views, gather fills every rank's buffer", "[actors]") {
  Fixture f(1);
  auto buffer = f.flat[0]->buffer();
  auto shard = spawn_parameter_shard(f.spec, std::move(f.flat), comm("ps_gather"));
  auto parts = checked(ask<Buffers>(shard, kTimeout, "partitions", partitions_atom::value));
  REQUIRE(parts.tensors.size() == 1);
  const auto& layout = f.spec->plan->groups()[0].layout;
  CHECK(parts.tensors[0].data_ptr() == static_cast<char*>(buffer.data_ptr()) + 4 * layout.partition_begin(kRank));
  parts.tensors[0].fill_(float(kRank + 1));  // the update the optimizer would write
  checked(ask<Done>(shard, kTimeout, "gather", gather_atom::value));
  for (int r = 0; r < kWorld; ++r)
    CHECK(torch::equal(buffer.narrow(0, layout.partition_begin(r), layout.partition_numel),
                       torch::full({layout.partition_numel}, float(r + 1))));
  // The module's parameters are views of that buffer.
  CHECK(f.a.data_ptr() == buffer.data_ptr());
  auto all = checked(ask<Buffers>(shard, kTimeout, "buffers", buffers_atom::value, BufferContents::tensors));
  CHECK(all.tensors[0].data_ptr() == buffer.data_ptr());
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
}

TEST_CASE("gradient-reducer (stage 1): ready in any order, finish gives the averaged partition, zero zeroes",
          "[actors]") {
  Fixture f(1);
  auto reducer = spawn_gradient_reducer(f.spec, {f.a, f.b}, f.flat, nullptr, nullptr, comm("gr_stage1"));
  f.set_gradients();  // into the flat gradient buffer (.grad are its views)
  caf::anon_send(reducer, begin_atom::value);
  // Ranks report in different orders; the plan fixes what is issued.
  for (int64_t i : kRank % 2 == 0 ? std::vector<int64_t>{0, 1} : std::vector<int64_t>{1, 0})
    caf::anon_send(reducer, ready_atom::value, i);
  caf::anon_send(reducer, flush_atom::value);
  auto ready = checked(ask<GradientsReady>(reducer, kTimeout, "finish", finish_atom::value, FinishRequest{}));
  REQUIRE(ready.partitions.size() == 1);
  const auto& layout = f.layout();
  const auto partition = ready.partitions[0];
  REQUIRE(partition.numel() == layout.partition_numel);
  for (int64_t j = 0; j < partition.numel(); ++j)
    CHECK(partition[j].item<float>() == f.average(layout.partition_begin(kRank) + j));
  CHECK_FALSE(ready.overflow);
  CHECK(ask<ReducerMemory>(reducer, kTimeout, "memory", memory_atom::value).gradients == layout.padded_numel * 4);
  checked(ask<Done>(reducer, kTimeout, "zero", zero_atom::value));
  CHECK(f.a.grad().abs().sum().item<float>() == 0.0f);
  CHECK(f.b.grad().data_ptr() != nullptr);  // still a view, now zero
  caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);
}

TEST_CASE("gradient-reducer (stage 2): staged buckets reduced to their owners, .grad released", "[actors]") {
  if (kWorld == 1) return;  // one rank partitions nothing
  Fixture f(2, /*bucket=*/4);  // several buckets per partition, fewer staging slots than buckets
  auto staging = std::make_shared<BucketStaging>(f.spec, std::vector<at::Tensor>{f.a, f.b});
  auto reducer = spawn_gradient_reducer(f.spec, {f.a, f.b}, f.flat, staging, nullptr, comm("gr_stage2"));
  for (int round = 0; round < 2; ++round) {  // every backward adds into the partition
    f.set_gradients();
    staging->start();
    caf::anon_send(reducer, begin_atom::value);
    staging->take(kRank % 2 == 0 ? 1 : 0);
    staging->take_rest();
    caf::anon_send(reducer, flush_atom::value);
    CHECK_FALSE(f.a.grad().defined());
    CHECK_FALSE(f.b.grad().defined());
  }
  auto ready = checked(ask<GradientsReady>(reducer, kTimeout, "finish", finish_atom::value, FinishRequest{}));
  const auto& layout = f.layout();
  for (int64_t j = 0; j < layout.partition_numel; ++j)
    CHECK(ready.partitions[0][j].item<float>() == 2 * f.average(layout.partition_begin(kRank) + j));
  checked(ask<Done>(reducer, kTimeout, "zero", zero_atom::value));
  ready = checked(ask<GradientsReady>(reducer, kTimeout, "finish", finish_atom::value, FinishRequest{}));
  CHECK(ready.partitions[0].abs().sum().item<float>() == 0.0f);
  caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);
}

TEST_CASE("optimizer-shard: one step through the reducer and the parameter-shard; states by message", "[actors]") {
  Fixture f(1);
  optim::OptimizerOptions sgd;
  sgd.kind = optim::OptimizerKind::SGD, sgd.lr = 0.5, sgd.momentum = 0.9;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels{optim::make_optimizer_kernel(sgd)};
  auto buffer = f.flat[0]->buffer();
  std::vector<at::Tensor> partitions{f.flat[0]->partition(kRank)};
  auto reducer = spawn_gradient_reducer(f.spec, {f.a, f.b}, f.flat, nullptr, nullptr, comm("os_grad"));
  auto shard = spawn_parameter_shard(f.spec, std::move(f.flat), comm("os_param"));
  auto optimizer = spawn_optimizer_shard(f.spec, kernels, partitions, reducer, shard);
  f.set_gradients();
  caf::anon_send(reducer, begin_atom::value);
  caf::anon_send(reducer, ready_atom::value, int64_t(0));
  caf::anon_send(reducer, ready_atom::value, int64_t(1));
  caf::anon_send(reducer, flush_atom::value);
  StepRequest request;
  request.hyperparameters = {{0.5, 0.9, 0.999}};
  auto report = checked(ask<StepReport>(optimizer, kTimeout, "step", step_atom::value, request));
  CHECK_FALSE(report.overflow);
  // SGD's first step from zeros: p = -lr * g_avg on every rank (gathered), padding untouched.
  for (int64_t e = 0; e < f.layout().padded_numel; ++e) CHECK(buffer[e].item<float>() == -0.5f * f.average(e));
  // The gradients were zeroed as part of the step.
  CHECK(f.a.grad().abs().sum().item<float>() == 0.0f);
  auto states = checked(ask<OptimizerStates>(optimizer, kTimeout, "states", states_atom::value));
  REQUIRE(states.state_names.at(0) == std::vector<std::string>{"momentum_buffer"});
  CHECK_FALSE(states.masters.at(0).defined());  // fp32: the weights are the master
  const auto& momentum = states.states.at(0).at(0);
  for (int64_t j = 0; j < momentum.numel(); ++j)
    CHECK(momentum[j].item<float>() == f.average(f.layout().partition_begin(kRank) + j));
  CHECK(states.state_bytes == f.layout().partition_numel * 4);
  caf::anon_send_exit(optimizer, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(reducer, caf::exit_reason::user_shutdown);
}
