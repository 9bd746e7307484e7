#include "actors/optimizer_shard.h"

#include <torch/types.h>  // clip_grad.h needs it first
#include <torch/nn/utils/clip_grad.h>

#include <ATen/ATen.h>

#include "actors/detail/engine_shared.h"
#include "actors/protocol.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

struct OptimizerShardState {
  std::shared_ptr<detail::EngineShared> shared;
  std::shared_ptr<optim::FlatOptimizer> optimizer;
  caf::actor reducer;
  caf::actor parameter_shard;

  int64_t owned_rank() const { return shared->stage >= 1 ? shared->rank : 0; }

  double clip(double max_norm) {
    auto& flat = *shared->flat;
    if (shared->stage < 2 || shared->world == 1) {
      // Every rank holds every averaged gradient: LibTorch's own function, bit for bit.
      return torch::nn::utils::clip_grad_norm_(flat.parameters(), max_norm);
    }
    const auto& layout = flat.layout();
    auto sums = at::zeros({int64_t(layout.params.size())}, at::kDouble);
    for (const auto& f : layout.fragments(shared->rank))
      sums[f.param_index] += flat.grad_buffer().narrow(0, f.flat_begin, f.length).to(at::kDouble).pow(2).sum();
    transport::ReduceOptions sum;
    shared->dp->all_reduce(sums, sum)->wait();
    auto total = sums.sqrt().to(flat.grad_buffer().scalar_type()).norm();
    auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
    flat.grad_partition(shared->rank).mul_(coefficient);
    return total.item<double>();
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
                    for (auto& work : issued.works) work->wait();
                    if (request.max_grad_norm > 0) report.grad_norm = st.clip(request.max_grad_norm);
                    const auto& flat = *st.shared->flat;
                    st.optimizer->step(flat.partition(st.owned_rank()), flat.grad_partition(st.owned_rank()),
                                       request.hyperparameters);
                  } catch (...) {
                    fail(std::current_exception());
                    return;
                  }
                  self->request(st.parameter_shard, timeout, gather_atom::value)
                      .then(
                          [=](GatherReport& gathered) mutable {
                            StepReport done = report;
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
