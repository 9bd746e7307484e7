#include "actors/optimizer_shard.h"

#include <torch/types.h>  // clip_grad.h needs it first
#include <torch/nn/utils/clip_grad.h>

#include <ATen/ATen.h>

#include <chrono>

#include "actors/detail/engine_shared.h"
#include "actors/protocol.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

struct OptimizerShardState {
  std::shared_ptr<detail::EngineShared> shared;
  std::vector<std::shared_ptr<optim::FlatOptimizer>> optimizers;  // per flat group
  caf::actor reducer;
  caf::actor parameter_shard;

  // Global norm of the averaged gradients as torch::nn::utils::clip_grad_norm_ defines it, from
  // our partitions `g` (one per flat group, partition-relative): per-parameter squared norms,
  // summed across ranks when partitions do not hold every parameter; each `g` is scaled in place.
  double clip_partitions(const std::vector<at::Tensor>& g, double max_norm) {
    const int64_t owned = shared->owned_rank();
    auto sums = at::zeros({int64_t(shared->names.size())}, at::kDouble);
    for (size_t k = 0; k < shared->groups.size(); ++k) {
      const auto& group = shared->groups[k];
      const auto& layout = group.flat->layout();
      const int64_t base = layout.partition_begin(owned);
      for (const auto& f : layout.fragments(owned))
        sums[group.params[f.param_index]] += g[k].narrow(0, f.flat_begin - base, f.length).to(at::kDouble).pow(2).sum();
    }
    if (shared->stage >= 1 && shared->world > 1) shared->dp->all_reduce(sums, transport::ReduceOptions{})->wait();
    auto total = sums.sqrt().to(at::kFloat).norm();
    auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (const auto& t : g) t.mul_(coefficient.to(t.scalar_type()));
    return total.item<double>();
  }

  const optim::StepHyperparameters& hp(const StepRequest& request, size_t group) const {
    return request.hyperparameters.at(size_t(shared->groups[group].param_group));
  }

  // One update of our partitions; false when it was skipped (fp16 overflow).
  bool update(const StepRequest& request, StepReport& report) {
    const int64_t owned = shared->owned_rank();
    const auto& groups = shared->groups;
    const bool fp32 = shared->dtype == at::kFloat;
    if (fp32) {
      std::vector<at::Tensor> grads;
      for (const auto& group : groups) grads.push_back(group.gradient_partition(owned));
      if (request.max_grad_norm > 0) {
        // Every rank holds every averaged gradient at stages 0/1: LibTorch's own function, bitwise.
        report.grad_norm = shared->stage < 2 || shared->world == 1
                               ? torch::nn::utils::clip_grad_norm_(shared->parameters, request.max_grad_norm)
                               : clip_partitions(grads, request.max_grad_norm);
      }
      for (size_t k = 0; k < groups.size(); ++k)
        optimizers[k]->step(groups[k].flat->partition(owned), grads[k], hp(request, k));
      return true;
    }
    // Mixed precision: unscale (fp16), check overflow on every rank, clip, update.
    std::vector<at::Tensor> grads;
    bool finite = true;
    for (const auto& group : groups) {
      auto grad = group.gradient_partition(owned);
      auto g = group.master.defined() ? grad.to(at::kFloat) : grad;  // the fp32 accumulator: itself
      if (request.loss_scale != 1.0) g.mul_(1.0 / request.loss_scale);
      if (shared->fp16) finite = finite && at::isfinite(g).all().item<bool>();
      grads.push_back(g);
    }
    if (shared->fp16) {
      auto flag = at::full({1}, finite ? 0.0f : 1.0f, at::kFloat);
      if (shared->world > 1) {
        transport::ReduceOptions max;
        max.op = transport::ReduceOp::max;
        shared->dp->all_reduce(flag, max)->wait();
      }
      if (flag.item<float>() > 0) {
        report.overflow = true;
        return false;
      }
    }
    if (request.max_grad_norm > 0) report.grad_norm = clip_partitions(grads, request.max_grad_norm);
    for (size_t k = 0; k < groups.size(); ++k) {
      auto param = groups[k].flat->partition(owned);
      if (groups[k].master.defined()) {
        optimizers[k]->step(groups[k].master, grads[k], hp(request, k));
        param.copy_(groups[k].master);  // round to the parameters' dtype
      } else {
        optimizers[k]->step(param, grads[k], hp(request, k));
      }
    }
    return true;
  }
};

caf::behavior optimizer_shard(caf::stateful_actor<OptimizerShardState>* self,
                              std::shared_ptr<detail::EngineShared> shared,
                              std::vector<std::shared_ptr<optim::FlatOptimizer>> optimizers, caf::actor reducer,
                              caf::actor parameter_shard) {
  auto& s = self->state;
  s.shared = std::move(shared);
  s.optimizers = std::move(optimizers);
  s.reducer = std::move(reducer);
  s.parameter_shard = std::move(parameter_shard);
  const auto timeout = s.shared->timeout;
  return {
      [=](step_atom, const StepRequest& request) -> caf::result<StepReport> {
        auto promise = self->make_response_promise<StepReport>();
        auto fail = [=](std::exception_ptr e) mutable {
          StepReport report;
          report.error = std::move(e);
          promise.deliver(report);
        };
        self->request(self->state.reducer, timeout, collect_atom::value)
            .then(
                [=](WorkList& issued) mutable {
                  auto& st = self->state;
                  StepReport report;
                  try {
                    if (issued.error) std::rethrow_exception(issued.error);
                    auto t0 = std::chrono::steady_clock::now();
                    issued.wait_all();
                    report.reduction_wait_s = seconds_since(t0);
                    t0 = std::chrono::steady_clock::now();
                    const bool updated = st.update(request, report);
                    report.update_s = seconds_since(t0);
                    if (!updated) {
                      promise.deliver(report);  // skipped: nothing changed, nothing to gather
                      return;
                    }
                  } catch (...) {
                    fail(std::current_exception());
                    return;
                  }
                  const auto gather_start = std::chrono::steady_clock::now();
                  self->request(st.parameter_shard, timeout, gather_atom::value)
                      .then(
                          [=](GatherReport& gathered) mutable {
                            StepReport done = report;
                            done.gather_s = seconds_since(gather_start);
                            done.error = gathered.error;
                            promise.deliver(done);
                          },
                          [=](caf::error& e) mutable {
                            fail(std::make_exception_ptr(
                                Error("parameter-shard gather failed: " + self->system().render(e))));
                          });
                },
                [=](caf::error& e) mutable {
                  fail(std::make_exception_ptr(
                      Error("gradient-reducer did not hand over its reductions: " + self->system().render(e))));
                });
        return promise;
      },
  };
}

}  // namespace

caf::actor spawn_optimizer_shard(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared,
                                 std::vector<std::shared_ptr<optim::FlatOptimizer>> optimizers, caf::actor reducer,
                                 caf::actor parameter_shard) {
  return system.spawn<caf::detached>(optimizer_shard, std::move(shared), std::move(optimizers), std::move(reducer),
                                     std::move(parameter_shard));
}

}  // namespace tessera::actors
