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
  std::shared_ptr<optim::FlatOptimizer> optimizer;
  at::Tensor master;  // fp32 copy of our partition (mixed precision with fp32 master), else undefined
  caf::actor reducer;
  caf::actor parameter_shard;

  int64_t owned_rank() const { return shared->stage >= 1 ? shared->rank : 0; }

  // Global norm of the averaged gradients as torch::nn::utils::clip_grad_norm_ defines it, from
  // our partition `g` (partition-relative): per-parameter squared norms summed across ranks when
  // the partition does not hold every parameter; `g` is scaled in place when clipping.
  double clip_partition(const at::Tensor& g, double max_norm) {
    const auto& layout = shared->flat->layout();
    const int64_t owned = owned_rank(), base = layout.partition_begin(owned);
    auto sums = at::zeros({int64_t(layout.params.size())}, at::kDouble);
    for (const auto& f : layout.fragments(owned))
      sums[f.param_index] += g.narrow(0, f.flat_begin - base, f.length).to(at::kDouble).pow(2).sum();
    if (shared->stage >= 1 && shared->world > 1) shared->dp->all_reduce(sums, transport::ReduceOptions{})->wait();
    auto total = sums.sqrt().to(at::kFloat).norm();
    auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
    g.mul_(coefficient.to(g.scalar_type()));
    return total.item<double>();
  }

  // One update of our partition; false when it was skipped (fp16 overflow).
  bool update(const StepRequest& request, StepReport& report) {
    auto& flat = *shared->flat;
    const int64_t owned = owned_rank();
    auto param = flat.partition(owned);
    auto grad = flat.grad_partition(owned);
    if (!master.defined() && shared->dtype == at::kFloat) {
      if (request.max_grad_norm > 0) {
        // Every rank holds every averaged gradient at stages 0/1: LibTorch's own function, bitwise.
        report.grad_norm = shared->stage < 2 || shared->world == 1
                               ? torch::nn::utils::clip_grad_norm_(flat.parameters(), request.max_grad_norm)
                               : clip_partition(grad, request.max_grad_norm);
      }
      optimizer->step(param, grad, request.hyperparameters);
      return true;
    }
    // Mixed precision: unscale (fp16), check overflow on every rank, clip, update.
    auto g = master.defined() ? grad.to(at::kFloat) : grad;
    if (request.loss_scale != 1.0) g.mul_(1.0 / request.loss_scale);
    if (shared->fp16) {
      auto flag = at::full({1}, at::isfinite(g).all().item<bool>() ? 0.0f : 1.0f, at::kFloat);
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
    if (request.max_grad_norm > 0) report.grad_norm = clip_partition(g, request.max_grad_norm);
    if (master.defined()) {
      optimizer->step(master, g, request.hyperparameters);
      param.copy_(master);  // round to the parameters' dtype
    } else {
      optimizer->step(param, g, request.hyperparameters);
    }
    return true;
  }
};

caf::behavior optimizer_shard(caf::stateful_actor<OptimizerShardState>* self,
                              std::shared_ptr<detail::EngineShared> shared,
                              std::shared_ptr<optim::FlatOptimizer> optimizer, caf::actor reducer,
                              caf::actor parameter_shard) {
  auto& s = self->state;
  s.shared = std::move(shared);
  s.optimizer = std::move(optimizer);
  s.reducer = std::move(reducer);
  s.parameter_shard = std::move(parameter_shard);
  s.master = s.shared->master;  // created by the engine (it also describes it in storage maps)
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
                    for (auto& work : issued.works) work->wait();
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
                                 std::shared_ptr<optim::FlatOptimizer> optimizer, caf::actor reducer,
                                 caf::actor parameter_shard) {
  return system.spawn<caf::detached>(optimizer_shard, std::move(shared), std::move(optimizer), std::move(reducer),
                                     std::move(parameter_shard));
}

}  // namespace tessera::actors
