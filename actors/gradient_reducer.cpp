#include "actors/gradient_reducer.h"

#include <ATen/ATen.h>

#include "actors/bucket_staging.h"
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
  size_t finished = 0;           // issued.works[0, finished) completed and finished
  std::shared_ptr<BucketStaging> staging;  // partitioned gradients: this backward's bucket inputs

  void start(std::shared_ptr<BucketStaging> buckets) {  // not begin(): CAF would take the state for a container
    const auto& plan = shared->plan;
    missing.assign(plan.buckets.size(), 0);
    for (size_t k = 0; k < plan.buckets.size(); ++k) missing[k] = int64_t(plan.buckets[k].params.size());
    seen.assign(plan.param_buckets.size(), 0);
    staging = std::move(buckets);
    next = 0;
    active = true;
  }

  // Runs the finisher of every leading work already complete (in issue order: partitioned
  // gradients add into the reduced partition) and drops it, so its staging buffer is freed while
  // training goes on instead of at step(). Never blocks.
  void finish_completed() {
    while (finished < issued.works.size() && issued.works[finished]->done()) {
      try {
        issued.works[finished]->wait();
        if (issued.finish[finished]) issued.finish[finished]();
      } catch (...) {
        if (!issued.error) issued.error = std::current_exception();
        return;
      }
      issued.works[finished] = nullptr;
      issued.finish[finished] = nullptr;
      ++finished;
    }
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
        auto input = staging->release(k);
        auto out = at::empty({length}, input.options());
        issued.works.push_back(shared->dp->reduce_scatter(input, out, average));
        auto slice = group.reduced.narrow(0, bucket.begin, length);
        issued.finish.push_back([slice, out]() mutable { slice.add_(out); });
        return;
      }
      // Stages 0/1 (stage 2 across ranks always partitions gradients): all-reduce in place.
      if (group.accum.defined()) group.fold(bucket.begin, length);  // final now: fold it first
      const auto range = group.gradients().narrow(0, bucket.begin, length);
      const bool cast = group.comm_dtype != range.scalar_type();  // autocast: reduce in bf16
      auto data = cast ? range.to(group.comm_dtype) : range;
      issued.works.push_back(shared->dp->all_reduce(data, average));
      std::function<void()> finish;
      if (cast) finish = [range, data]() mutable { range.copy_(data); };
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
    for (int64_t k : shared->plan.param_buckets[param]) --missing[k];
    if (shared->overlap_comm) issue_ready();  // else everything waits for flush (end of backward)
  }

  void flush() {
    if (!active) return;
    while (next < missing.size()) issue(next++);
  }
};

caf::behavior reducer(caf::stateful_actor<ReducerState>* self, std::shared_ptr<detail::EngineShared> shared) {
  self->state.shared = std::move(shared);
  return {
      [=](begin_atom, std::shared_ptr<BucketStaging> staging) { self->state.start(std::move(staging)); },
      [=](ready_atom, int64_t param) {
        self->state.ready(param);
        self->state.finish_completed();
      },
      [=](flush_atom) {
        self->state.flush();
        self->state.finish_completed();
      },
      [=](collect_atom) -> WorkList {
        auto& s = self->state;
        s.flush();
        s.active = false;
        WorkList out = std::move(s.issued);
        s.issued = WorkList{};
        s.finished = 0;
        return out;
      },
  };
}

}  // namespace

caf::actor spawn_gradient_reducer(caf::actor_system& system, std::shared_ptr<detail::EngineShared> shared) {
  return system.spawn(reducer, std::move(shared));
}

}  // namespace tessera::actors
