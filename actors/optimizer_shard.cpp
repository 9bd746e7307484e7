#include "actors/optimizer_shard.h"

#include <ATen/ATen.h>

#include <chrono>

#include "actors/actor_runtime.h"
#include "actors/ask.h"
#include "core/optim/state_store.h"

namespace tessera::actors {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct OptimizerShardState {
  std::shared_ptr<const EngineSpec> spec;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels;  // per flat group
  std::unique_ptr<optim::StateStore> store;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> sub_groups;  // per flat group
  optim::Workspace workspace;
  int64_t updates = 0;
  gradient_reducer_actor reducer;
  parameter_shard_actor parameter_shard;

  // Every collective behind a request has its own timeout; this bound only guards against a lost actor.
  std::chrono::milliseconds bound() const { return 3 * spec->timeout + std::chrono::seconds(10); }

  void update(const StepRequest& request, const GradientsReady& ready, const Buffers& parameters) {
    const auto& groups = spec->plan->groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& kernel = *kernels[g];
      const auto& hp = request.hyperparameters.at(size_t(groups[g].param_group));
      const auto& grad = ready.partitions.at(g);
      const auto& param = parameters.tensors.at(g);
      for (size_t s = 0; s < sub_groups[g].size(); ++s) {
        const auto [begin, end] = sub_groups[g][s];
        auto state = store->acquire(int64_t(g), int64_t(s));
        auto target_param = param.narrow(0, begin, end - begin);
        const auto& target = state.master.defined() ? state.master : target_param;
        kernel.step(target, grad.narrow(0, begin, end - begin), state.states, updates + 1, hp, workspace);
        if (state.master.defined()) target_param.copy_(state.master);  // round into the parameters' dtype
        store->release(int64_t(g), int64_t(s));
      }
    }
    ++updates;
  }

  StepReport step(const StepRequest& request) {
    StepReport report;
    FinishRequest finish{request.loss_scale, request.max_grad_norm};
    auto ready = checked(ask<GradientsReady>(reducer, bound(), "gradient-reducer (finish)", finish_atom::value, finish));
    report.reduction_wait_s = ready.reduction_wait_s;
    report.grad_norm = ready.grad_norm;
    report.overflow = ready.overflow;
    caf::scoped_actor self{actor_system()};
    std::exception_ptr failure;
    auto on_reply = [&](Done& d) {
      if (d.error && !failure) failure = d.error;
    };
    auto on_error = [&](caf::error& e) {
      if (!failure) failure = std::make_exception_ptr(Error("optimizer-shard: a peer actor did not answer: " +
                                                            actor_system().render(e)));
    };
    if (!ready.overflow) {
      auto t0 = std::chrono::steady_clock::now();
      auto parameters = checked(ask<Buffers>(parameter_shard, bound(), "parameter-shard (partitions)", partitions_atom::value));
      update(request, ready, parameters);
      report.update_s = seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      // The gather (parameter communicator) and zeroing the gradients run at the same time.
      auto gathered = self->request(parameter_shard, bound(), gather_atom::value);
      auto zeroed = self->request(reducer, bound(), zero_atom::value);
      gathered.receive(on_reply, on_error);
      report.gather_s = seconds_since(t0);
      zeroed.receive(on_reply, on_error);
    } else {
      self->request(reducer, bound(), zero_atom::value).receive(on_reply, on_error);
    }
    if (failure) std::rethrow_exception(failure);
    return report;
  }
};

optimizer_shard_actor::behavior_type optimizer_shard(optimizer_shard_actor::stateful_pointer<OptimizerShardState> self,
                                                     std::shared_ptr<OptimizerShardState> init) {
  self->state = std::move(*init);
  return {
      [=](step_atom, const StepRequest& request) -> StepReport {
        try {
          return self->state.step(request);
        } catch (...) {
          StepReport report;
          report.error = std::current_exception();
          return report;
        }
      },
      [=](refresh_atom, const RefreshRequest& request) -> Done {
        Done done;
        auto& s = self->state;
        try {
          auto parameters = checked(ask<Buffers>(s.parameter_shard, s.bound(), "parameter-shard (partitions)", partitions_atom::value));
          for (const auto& r : request.ranges) {
            auto master = s.store->partition_master(r.group);
            if (master.defined())
              master.narrow(0, r.begin, r.length).copy_(parameters.tensors.at(size_t(r.group)).narrow(0, r.begin, r.length));
          }
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](states_atom) -> OptimizerStates {
        auto& s = self->state;
        OptimizerStates out;
        for (size_t g = 0; g < s.kernels.size(); ++g) {
          out.state_names.push_back(s.kernels[g]->state_names());
          out.masters.push_back(s.store->partition_master(int64_t(g)));
          out.states.push_back(s.store->partition_states(int64_t(g)));
        }
        out.master_bytes = s.store->master_bytes();
        out.state_bytes = s.store->state_bytes();
        out.workspace_bytes = s.workspace.bytes();
        out.updates = s.updates;
        return out;
      },
      [=](restore_atom, const OptimizerCounters& counters) -> Done {
        self->state.updates = counters.updates;
        return Done{};
      },
  };
}

}  // namespace

optimizer_shard_actor spawn_optimizer_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels,
                                            const std::vector<at::Tensor>& partitions, gradient_reducer_actor reducer,
                                            parameter_shard_actor parameter_shard) {
  auto s = std::make_shared<OptimizerShardState>();
  std::vector<optim::MemoryStateStore::Group> store;
  for (size_t g = 0; g < partitions.size(); ++g) {
    const auto& plan_group = spec->plan->groups()[g];
    optim::MemoryStateStore::Group group;
    const auto& partition = partitions[g];
    if (spec->fp32_master) group.master = partition.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    group.states = kernels[g]->initial_states(group.master.defined() ? group.master : partition);
    if (kernels[g]->whole_partition()) {
      group.sub_groups.push_back({0, plan_group.layout.partition_numel});
    } else {
      for (const auto& sub : plan_group.sub_groups) group.sub_groups.push_back({sub.begin, sub.end});
    }
    s->sub_groups.push_back(group.sub_groups);
    store.push_back(std::move(group));
  }
  s->store = std::make_unique<optim::MemoryStateStore>(std::move(store));
  s->spec = std::move(spec);
  s->kernels = std::move(kernels);
  s->reducer = std::move(reducer);
  s->parameter_shard = std::move(parameter_shard);
  return actor_system().spawn<caf::detached>(optimizer_shard, std::move(s));
}

}  // namespace tessera::actors
