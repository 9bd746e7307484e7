#include "actors/gradient_reducer.h"

#include <ATen/ATen.h>

#include "actors/detail/engine_shared.h"
#include "actors/protocol.h"

namespace tessera::actors {
namespace {

struct ReducerState {
  std::shared_ptr<detail::EngineShared> shared;
  std::vector<int64_t> missing;  // per bucket: parameters not ready yet
  std::vector<char> seen;        // per parameter: reported in this backward
  size_t next = 0;               // next bucket to issue
  bool active = false;
  WorkList issued;               // since the last collect
  // Partitioned gradients: each bucket's packed input, filled as its parameters become ready.
  std::vector<at::Tensor> staging;
  std::vector<std::pair<int64_t, int64_t>> place;  // per parameter: (flat group, index in it)

  void start() {  // not begin(): CAF would take the state for a container
    const auto& plan = shared->plan;
    missing.assign(plan.buckets.size(), 0);
    for (size_t k = 0; k < plan.buckets.size(); ++k) missing[k] = int64_t(plan.buckets[k].params.size());
    seen.assign(plan.param_buckets.size(), 0);
    staging.assign(plan.buckets.size(), at::Tensor());
    if (place.empty()) {
      place.resize(plan.param_buckets.size());
      for (size_t g = 0; g < shared->groups.size(); ++g)
        for (size_t j = 0; j < shared->groups[g].params.size(); ++j)
          place[shared->groups[g].params[j]] = {int64_t(g), int64_t(j)};
    }
    next = 0;
    active = true;
  }

  // Partitioned gradients: copies parameter `param`'s .grad (final for this backward; absent
  // means zero) into the staging buffers of its buckets, then releases it.
  void take(int64_t param) {
    const auto& plan = shared->plan;
    const auto& group = shared->groups[place[param].first];
    const auto& p = shared->parameters[param];
    at::Tensor grad = p.grad().defined() ? p.grad().reshape(-1) : at::Tensor();
    for (int64_t k : plan.param_buckets[param]) {
      const auto& bucket = plan.buckets[k];
      if (!staging[k].defined())
        staging[k] = at::zeros({(bucket.end - bucket.begin) * shared->world},
                               at::TensorOptions().dtype(group.comm_dtype));
      if (!grad.defined()) continue;
      for (const auto& c : zero::staging_copies(group.flat->layout(), plan.shape, bucket, place[param].second))
        staging[k].narrow(0, c.staging_begin, c.length).copy_(grad.narrow(0, c.param_begin, c.length));
    }
    p.mutable_grad() = at::Tensor();
  }

  void issue(size_t k) {
    if (issued.error) return;  // a failed issue already broke this reduction
    try {
      const auto& bucket = shared->plan.buckets[k];
      const auto& group = shared->groups[bucket.group];
      const int64_t length = bucket.end - bucket.begin;
      transport::ReduceOptions average;
      average.op = transport::ReduceOp::avg;
      if (shared->partitioned_gradients) {
        // Reduce-scatter the packed input; this rank's slice is added into its partition.
        auto input = staging[k].defined() ? std::move(staging[k])
                                          : at::zeros({length * shared->world}, at::TensorOptions().dtype(group.comm_dtype));
        staging[k] = at::Tensor();
        auto out = at::empty({length}, input.options());
        issued.works.push_back(shared->dp->reduce_scatter(input, out, average));
        auto slice = group.reduced.narrow(0, bucket.begin, length);
        issued.finish.push_back([slice, out]() mutable { slice.add_(out); });
        return;
      }
      if (group.accum.defined()) {  // this bucket's gradients are final: fold them first
        if (shared->plan.shape == zero::BucketShape::all_reduce) {
          group.fold(bucket.begin, length);
        } else {
          for (int r = 0; r < shared->world; ++r)
            group.fold(r * group.flat->layout().partition_numel + bucket.begin, length);
        }
      }
      const auto& grads = group.gradients();
      const bool cast = group.comm_dtype != grads.scalar_type();  // autocast: reduce in bf16
      std::function<void()> finish;
      if (shared->plan.shape == zero::BucketShape::all_reduce) {
        auto range = grads.narrow(0, bucket.begin, length);
        auto data = cast ? range.to(group.comm_dtype) : range;
        issued.works.push_back(shared->dp->all_reduce(data, average));
        if (cast) finish = [range, data]() mutable { range.copy_(data); };
      } else {
        // Input: slice [r*P + begin, r*P + end) of every rank r, packed; output: our own slice.
        const int64_t P = group.flat->layout().partition_numel;
        auto staging = at::empty({length * shared->world}, grads.options().dtype(group.comm_dtype));
        for (int r = 0; r < shared->world; ++r)
          staging.narrow(0, r * length, length).copy_(grads.narrow(0, r * P + bucket.begin, length));
        auto own = grads.narrow(0, shared->rank * P + bucket.begin, length);
        auto out = cast ? at::empty({length}, staging.options()) : own;
        issued.works.push_back(shared->dp->reduce_scatter(staging, out, average));
        if (cast) finish = [own, out]() mutable { own.copy_(out); };
      }
      issued.finish.push_back(std::move(finish));
    } catch (...) {
      issued.error = std::current_exception();
    }
  }

  void issue_ready() {
    while (next < missing.size() && missing[next] == 0) issue(next++);
  }

  void ready(int64_t param) {
    if (!active || param < 0 || size_t(param) >= seen.size() || seen[param]) return;
    seen[param] = 1;
    if (shared->partitioned_gradients) take(param);
    for (int64_t k : shared->plan.param_buckets[param]) --missing[k];
    if (shared->overlap_comm) issue_ready();  // else everything waits for flush (end of backward)
  }

  void flush() {
    if (!active) return;
    if (shared->partitioned_gradients) {
      // Parameters autograd did not report (unused in this backward, or a coalesced / no_sync
      // reduction with no backward running): their accumulated .grad, or zeros.
      for (size_t param = 0; param < seen.size(); ++param)
        if (!seen[param]) seen[param] = 1, take(int64_t(param));
    }
    while (next < missing.size()) issue(next++);
  }
};

caf::behavior reducer(caf::stateful_actor<ReducerState>* self, std::shared_ptr<detail::EngineShared> shared) {
  self->state.shared = std::move(shared);
  return {
      [=](begin_atom) { self->state.start(); },
      [=](ready_atom, int64_t param) { self->state.ready(param); },
      [=](flush_atom) { self->state.flush(); },
      [=](collect_atom) -> WorkList {
        auto& s = self->state;
        s.flush();
        s.active = false;
        WorkList out = std::move(s.issued);
        s.issued = WorkList{};
        return out;
      },
  };
}

}  // namespace

caf::actor spawn_gradient_reducer(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared) {
  return system.spawn(reducer, std::move(shared));
}

}  // namespace tessera::actors
