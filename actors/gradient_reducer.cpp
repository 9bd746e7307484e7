#include "actors/gradient_reducer.h"

#include <torch/types.h>  // clip_grad.h needs it first
#include <torch/nn/utils/clip_grad.h>

#include <ATen/ATen.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>

#include "actors/actor_runtime.h"
#include "actors/final_sub_groups.h"
#include "actors/parked_reply.h"
#include "actors/waiting_finals.h"
#include "core/elapsed.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

int64_t bytes(const at::Tensor& t) { return t.defined() ? int64_t(t.numel() * t.element_size()) : 0; }

struct ReducerState {
  std::shared_ptr<const EngineSpec> spec;
  std::vector<at::Tensor> parameters;
  std::shared_ptr<BucketStaging> staging;         // stage 2
  std::shared_ptr<UnitGradStaging> unit_staging;  // stage 3
  std::shared_ptr<transport::Communicator> comm;
  // Owned buffers, per flat group (undefined where the mode does not use them).
  std::vector<std::unique_ptr<zero::FlatGradients>> flat;  // stages 0/1
  std::vector<at::Tensor> accum;    // fp32 accumulators (stages 0/1, fp32 accumulation)
  std::vector<at::Tensor> mirror;   // the comm-dtype copy of a group reduced in another dtype
  std::vector<at::Tensor> reduced;  // partitioned gradients: this rank's partition
  std::vector<at::Tensor> fp32;     // mixed precision: the partition the optimizer steps
  at::Tensor norms;                 // [parameters] double: per-parameter squared norms
  at::Tensor norm_scratch;          // double, for squared norms of partitions
  // One backward's progress.
  std::vector<int64_t> missing;     // per bucket: parameters not ready (stages 0/1)
  std::vector<char> seen;           // per parameter: reported
  std::map<size_t, StagedBucket> arrived;  // partitioned: staged, not issued yet
  size_t next = 0;                  // next bucket to issue
  bool active = false;
  // The partition range a finished reduction wrote (update during backward; length 0: none).
  struct Written {
    int64_t backward = -1;
    int64_t group = 0;
    int64_t begin = 0;
    int64_t length = 0;
  };
  struct Issued {
    std::shared_ptr<transport::Work> work;
    std::function<void()> finish;  // runs after the work completed (may be empty)
    Written written = {};
  };
  std::deque<Issued> issued;        // in issue order, not finished yet
  std::exception_ptr error;         // the first failure since the last finish/zero
  bool polling = false;
  zero::ParkedStorages parked;      // offload_states: the gradient buffers in host memory
  // Update during backward (stages 2/3 with an offloaded optimizer): which sub-groups are final,
  // those not handed to the optimizer-shard yet, and its requests waiting for one.
  bool tracks_finals = false;
  int64_t backward = 0;             // counts reducing backwards: a write counts for its own only
  FinalSubGroups finals;
  std::deque<std::pair<FinalSubGroups::Key, bool>> final_queue;  // and whether settle made it final
  WaitingFinals waiting;            // the optimizer-shard's requests for the next one
  bool settled = false;             // this backward's every sub-group is final

  // The written ranges of one backward, per flat group (what FinalSubGroups expects).
  std::vector<std::vector<FinalSubGroups::Range>> written_ranges() const {
    std::vector<std::vector<FinalSubGroups::Range>> out(plan().groups().size());
    if (mode() == zero::GradientMode::reduce_to_owner) {
      for (const auto& b : plan().buckets().buckets)
        if (b.owner == spec->rank) {
          const int64_t base = plan().groups()[size_t(b.group)].layout.partition_begin(b.owner);
          out[size_t(b.group)].push_back({b.begin - base, b.end - base});
        }
    } else if (mode() == zero::GradientMode::unit_reduce_scatter) {
      for (const auto& seg : plan().segments())
        out[size_t(seg.group)].push_back({seg.partition_offset, seg.partition_offset + seg.layout.partition_numel});
    }
    return out;
  }

  void written(const Written& w) {
    if (!tracks_finals || w.length <= 0 || w.backward != backward) return;
    std::vector<FinalSubGroups::Key> now;
    finals.cover(w.group, w.begin, w.length, now);
    for (const auto& k : now) final_queue.push_back({k, false});
    serve();
  }

  // Hands final sub-groups to waiting requests, oldest first; after a failed reduction, its error.
  void serve() {
    if (error && !waiting.empty()) return waiting.fail_all(error);  // `error` stays: finish reports it too
    while (!final_queue.empty() && !waiting.empty()) {
      const auto [key, at_settle] = final_queue.front();
      final_queue.pop_front();
      FinalGradients out;
      out.group = key.group, out.sub = key.sub, out.at_settle = at_settle;
      try {
        const auto& sub = plan().groups().at(size_t(key.group)).sub_groups.at(size_t(key.sub));
        out.gradients = reduced[size_t(key.group)].narrow(0, sub.begin, sub.elements());
        if (fp32[size_t(key.group)].defined()) {  // finish_step copies the whole partition again: the same bits
          auto range = fp32[size_t(key.group)].narrow(0, sub.begin, sub.elements());
          range.copy_(out.gradients);
          out.gradients = range;
        }
      } catch (...) {
        out.error = std::current_exception();
      }
      waiting.deliver_front(std::move(out));
    }
  }

  // Every reduction issued so far finished: every sub-group is final.
  void settle() {
    drain();
    if (!tracks_finals || settled) return;
    settled = true;
    std::vector<FinalSubGroups::Key> rest;
    finals.settle(rest);
    for (const auto& k : rest) final_queue.push_back({k, true});
    serve();
  }

  const zero::ShardingPlan& plan() const { return *spec->plan; }
  zero::GradientMode mode() const { return plan().gradient_mode(); }
  bool staged() const { return plan().staged_gradients(); }  // no flat buffer: each rank keeps its partition

  // ZeRO-3: a staged chunk reduce-scattered (averaged) into its piece, which is added into the
  // partition; then the slot goes back.
  void reduce_chunk(const StagedChunk& staged) {
    const Written write{backward, seg_group(staged.segment), plan().segments().at(size_t(staged.segment)).partition_offset + staged.begin,
                        staged.length};
    auto staging_ref = unit_staging;
    const int slot = staged.slot;
    const auto& seg = plan().segments().at(size_t(staged.segment));
    auto slice = reduced[size_t(seg.group)].narrow(0, seg.partition_offset + staged.begin, staged.length);
    if (!comm) {  // one rank: its gradients are their own average
      slice.add_(staged.data);
      staging_ref->give_back(slot);
      written(write);
      return;
    }
    transport::ReduceOptions average;
    average.op = transport::ReduceOp::avg;
    auto piece = staged.piece;
    std::shared_ptr<transport::Work> work;
    try {
      work = comm->reduce_scatter(staged.data, piece, average);
    } catch (...) {
      staging_ref->give_back(slot);
      throw;
    }
    issued.push_back({std::move(work),
                      [slice, piece, staging_ref, slot]() mutable {
                        slice.add_(piece);
                        staging_ref->give_back(slot);
                      },
                      write});
  }

  // The gradients a group's stages-0/1 buckets are read from.
  const at::Tensor& gradients(size_t g) const { return accum[g].defined() ? accum[g] : flat[g]->buffer(); }

  void fold(size_t g, int64_t begin, int64_t length) {  // low-precision gradients into the fp32 accumulator
    auto grad = flat[g]->buffer().narrow(0, begin, length);
    accum[g].narrow(0, begin, length).add_(grad);
    grad.zero_();
  }

  int64_t seg_group(int64_t segment) const { return plan().segments().at(size_t(segment)).group; }

  void start() {
    ++backward;
    if (tracks_finals) {
      if (!waiting.empty())  // requests of an earlier backward (a timed-out update): not for this one
        waiting.fail_all(std::make_exception_ptr(Error("gradient-reducer: a new backward started before the last one's "
                                                   "sub-groups were handed out")));
      finals.start();
      final_queue.clear();
      settled = false;
    }
    const auto& buckets = plan().buckets();
    missing.assign(buckets.buckets.size(), 0);
    for (size_t k = 0; k < buckets.buckets.size(); ++k) missing[k] = int64_t(buckets.buckets[k].params.size());
    seen.assign(buckets.param_buckets.size(), 0);
    arrived.clear();
    next = 0;
    active = true;
  }

  void fail(std::exception_ptr e) {
    if (!error) error = e;
  }

  // Issues bucket k (stages 0/1: an in-place all-reduce of its range; partitioned: the staged
  // bucket reduced to its owner).
  void issue(size_t k) {
    const auto& bucket = plan().buckets().buckets[k];
    const size_t g = size_t(bucket.group);
    transport::ReduceOptions average;
    average.op = transport::ReduceOp::avg;
    if (mode() == zero::GradientMode::reduce_to_owner) {
      StagedBucket staged = std::move(arrived.at(k));
      arrived.erase(k);
      std::function<void()> finish;
      Written write;
      auto staging_ref = staging;
      const int slot = staged.slot;
      if (bucket.owner == spec->rank) {
        const int64_t base = plan().groups()[g].layout.partition_begin(bucket.owner);
        write = {backward, int64_t(g), bucket.begin - base, bucket.elements()};
        auto slice = reduced[g].narrow(0, bucket.begin - base, bucket.elements());
        auto data = staged.data;
        finish = [slice, data, staging_ref, slot]() mutable {
          slice.add_(data);
          staging_ref->give_back(slot);
        };
      } else {
        finish = [staging_ref, slot] { staging_ref->give_back(slot); };
      }
      try {
        issued.push_back({comm->reduce(staged.data, bucket.owner, average), std::move(finish), write});
      } catch (...) {
        staging->give_back(slot);
        throw;
      }
      return;
    }
    if (accum[g].defined()) fold(g, bucket.begin, bucket.elements());  // final now: fold first
    if (!comm) return;  // one rank: its gradients are their own average
    auto range = gradients(g).narrow(0, bucket.begin, bucket.elements());
    std::function<void()> finish;
    at::Tensor data = range;
    if (mirror[g].defined()) {  // reduce in the comm dtype, copy back when done
      data = mirror[g].narrow(0, bucket.begin, bucket.elements());
      data.copy_(range);
      finish = [range, data]() mutable { range.copy_(data); };
    }
    issued.push_back({comm->all_reduce(data, average), std::move(finish)});
  }

  void issue_in_order(bool everything) {
    if (!active) return;
    const size_t n = plan().buckets().buckets.size();
    while (next < n) {
      const bool can = mode() == zero::GradientMode::reduce_to_owner ? arrived.count(next) > 0
                                                                     : (everything || missing[next] == 0);
      if (!can) break;
      try {
        issue(next);
      } catch (...) {
        fail(std::current_exception());
      }
      ++next;
    }
  }

  // Finishes reductions from the front while they are complete (never blocks).
  void finish_completed() {
    while (!issued.empty() && issued.front().work->done()) finish_front();
  }

  // Waits for the oldest reduction and finishes it.
  void finish_front() {
    auto item = std::move(issued.front());
    issued.pop_front();
    bool completed = true;
    try {
      item.work->wait();
    } catch (...) {
      fail(std::current_exception());
      completed = false;
    }
    if (item.finish) item.finish();
    if (completed) written(item.written);  // a failed reduction's range is not final
    else serve();                          // its error to whoever waits
  }

  // Everything issued so far, finished (a failure is kept in `error`).
  void drain() {
    issue_in_order(true);
    active = false;
    while (!issued.empty()) finish_front();
  }

  void zero() {
    for (size_t g = 0; g < plan().groups().size(); ++g) {
      if (flat[g]) flat[g]->zero();
      if (accum[g].defined()) accum[g].zero_();
      if (reduced[g].defined()) reduced[g].zero_();
    }
    if (staged())
      for (auto& p : parameters) p.mutable_grad() = at::Tensor();
  }

  // The squared L2 norm of every parameter, from the partitions `g` (partition-relative), summed
  // across ranks when partitions do not hold every parameter; then each `g` is scaled.
  double clip_partitions(const std::vector<at::Tensor>& g, double max_norm) {
    const int64_t owned = spec->owned_partition();
    norms.zero_();
    for (size_t k = 0; k < plan().groups().size(); ++k) {
      const auto& group = plan().groups()[k];
      for (const auto& f : plan().fragments(int64_t(k), owned)) {
        // In chunks through a double scratch buffer: no allocation of partition size.
        for (int64_t at = 0; at < f.length; at += norm_scratch.numel()) {
          const int64_t n = std::min<int64_t>(norm_scratch.numel(), f.length - at);
          auto chunk = norm_scratch.narrow(0, 0, n);
          chunk.copy_(g[k].narrow(0, f.flat_begin + at, n));
          norms[group.params[size_t(f.param_index)]] += chunk.pow_(2).sum();
        }
      }
    }
    if (plan().stage() >= 1 && comm) comm->all_reduce(norms, transport::ReduceOptions{})->wait();
    auto total = norms.sqrt().to(at::kFloat).norm();
    auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
    for (const auto& t : g) t.mul_(coefficient.to(t.scalar_type()));
    return total.item<double>();
  }

  GradientsReady finish_step(const FinishRequest& request) {
    GradientsReady out;
    const auto t0 = std::chrono::steady_clock::now();
    drain();
    out.reduction_wait_s = seconds_since(t0);
    if (error) std::rethrow_exception(std::exchange(error, nullptr));
    const int64_t owned = spec->owned_partition();
    const auto& groups = plan().groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      at::Tensor partition = reduced[g].defined() ? reduced[g] : gradients(g).narrow(0, groups[g].layout.partition_begin(owned),
                                                                                    groups[g].layout.partition_numel);
      if (fp32[g].defined()) {  // the fp32 master steps an fp32 gradient
        fp32[g].copy_(partition);
        partition = fp32[g];
      }
      out.partitions.push_back(partition);
    }
    if (spec->dtype == at::kFloat) {
      if (request.max_grad_norm > 0) {
        // Every rank holds every averaged gradient at stages 0/1: LibTorch's own function, bitwise.
        out.grad_norm = mode() == zero::GradientMode::all_reduce
                            ? torch::nn::utils::clip_grad_norm_(parameters, request.max_grad_norm)
                            : clip_partitions(out.partitions, request.max_grad_norm);
      }
      return out;
    }
    // Mixed precision: unscale (fp16), check overflow on every rank, clip.
    bool finite = true;
    for (auto& g : out.partitions) {
      if (request.loss_scale != 1.0) g.mul_(1.0 / request.loss_scale);
      if (spec->fp16) finite = finite && std::isfinite(g.sum().item<double>());
    }
    if (spec->fp16) {
      auto flag = at::full({1}, finite ? 0.0f : 1.0f, at::TensorOptions().dtype(at::kFloat).device(spec->device));
      if (comm) {
        transport::ReduceOptions max;
        max.op = transport::ReduceOp::max;
        comm->all_reduce(flag, max)->wait();
      }
      if (flag.item<float>() > 0) {
        out.overflow = true;
        return out;
      }
    }
    if (request.max_grad_norm > 0) out.grad_norm = clip_partitions(out.partitions, request.max_grad_norm);
    return out;
  }

  int64_t memory() const {
    int64_t n = 0;
    for (size_t g = 0; g < flat.size(); ++g) {
      if (flat[g]) n += bytes(flat[g]->buffer());
      n += bytes(accum[g]) + bytes(mirror[g]) + bytes(reduced[g]) + bytes(fp32[g]);
    }
    if (staged()) {
      if (staging) n += staging->bytes();
      if (unit_staging) n += unit_staging->bytes();
      for (const auto& p : parameters) n += bytes(p.grad());  // deferred or no_sync-accumulated
    }
    return n;
  }
};

gradient_reducer_actor::behavior_type reducer(gradient_reducer_actor::stateful_pointer<ReducerState> self,
                                              std::shared_ptr<ReducerState> init) {
  self->state = std::move(*init);
  // Poll while reductions are outstanding, so completed ones are finished (and their staging
  // slots come back) even when no message arrives.
  auto arm_poll = [self] {
    auto& s = self->state;
    // Only staging slots need to come back promptly (stages 0/1 finish at `finish`).
    // (ZeRO-3: finished reductions free their staged buffers.)
    if (s.polling || s.issued.empty() || !s.staged()) return;
    s.polling = true;
    self->delayed_send(self, std::chrono::milliseconds(1), poll_atom::value);
  };
  return {
      [=](begin_atom) {
        auto& s = self->state;
        try {
          require_unparked(s.parked, "backward");
          s.start();
        } catch (...) {
          s.fail(std::current_exception());
        }
      },
      [=](ready_atom, int64_t param) {
        auto& s = self->state;
        if (s.active && param >= 0 && size_t(param) < s.seen.size() && !s.seen[size_t(param)]) {
          s.seen[size_t(param)] = 1;
          for (int64_t k : s.plan().buckets().param_buckets[size_t(param)]) --s.missing[size_t(k)];
          if (s.spec->overlap_comm) s.issue_in_order(false);  // else everything waits for flush
        }
        s.finish_completed();
        arm_poll();
      },
      [=](bucket_atom, StagedBucket& staged) {
        auto& s = self->state;
        s.arrived[staged.bucket] = std::move(staged);
        s.issue_in_order(false);
        s.finish_completed();
        arm_poll();
      },
      [=](chunk_atom, const StagedChunk& staged) {
        auto& s = self->state;
        try {
          s.reduce_chunk(staged);
        } catch (...) {
          s.fail(std::current_exception());
        }
        s.finish_completed();
        arm_poll();
      },
      [=](flush_atom) {
        auto& s = self->state;
        s.issue_in_order(true);
        s.finish_completed();
        arm_poll();
      },
      [=](reclaim_atom) {
        auto& s = self->state;
        s.issue_in_order(false);
        if (!s.issued.empty()) s.finish_front();
        s.finish_completed();
        arm_poll();
      },
      [=](poll_atom) {
        auto& s = self->state;
        s.polling = false;
        s.finish_completed();
        arm_poll();
      },
      [=](fold_atom) -> Done {
        Done done;
        auto& s = self->state;
        try {
          for (size_t g = 0; g < s.accum.size(); ++g)
            if (s.accum[g].defined()) s.fold(g, 0, s.plan().groups()[g].layout.padded_numel);
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](finish_atom, const FinishRequest& request) -> GradientsReady {
        try {
          return self->state.finish_step(request);
        } catch (...) {
          GradientsReady out;
          out.error = std::current_exception();
          return out;
        }
      },
      [=](zero_atom) -> Done {
        Done done;
        auto& s = self->state;
        try {
          s.drain();
          s.zero();
          if (s.error) done.error = std::exchange(s.error, nullptr);
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](memory_atom) -> ReducerMemory {
        return {self->state.memory(), bytes(self->state.norm_scratch)};
      },
      [=](park_atom, const ParkRequest& request) -> Parked {
        return parked_reply([&] {
          auto& s = self->state;
          if (!request.asks(StateKind::gradients)) return int64_t(0);
          if (!s.issued.empty()) throw Error("offload_states: a backward's gradient reductions are still running");
          std::vector<at::Tensor> buffers;
          for (size_t g = 0; g < s.flat.size(); ++g) {
            if (s.flat[g]) buffers.push_back(s.flat[g]->buffer());
            for (const auto* t : {&s.accum[g], &s.mirror[g], &s.reduced[g], &s.fp32[g]}) buffers.push_back(*t);
          }
          if (s.staged())
            for (const auto& p : s.parameters) buffers.push_back(p.grad());  // deferred or no_sync-accumulated
          return s.parked.park(buffers, request.host);
        });
      },
      [=](unpark_atom) -> Parked { return parked_reply([&] { return self->state.parked.unpark(); }); },
      [=](next_final_atom) -> caf::typed_response_promise<FinalGradients> {
        auto& s = self->state;
        auto promise = self->make_response_promise<FinalGradients>();
        if (!s.tracks_finals || (s.settled && s.final_queue.empty())) {
          FinalGradients none;
          none.error = std::make_exception_ptr(Error(s.tracks_finals ? "gradient-reducer: every sub-group of this backward was handed out already"
                                                                     : "gradient-reducer: this engine does not update during backward"));
          promise.deliver(std::move(none));
          return promise;
        }
        s.waiting.push(promise);
        s.serve();
        return promise;
      },
      [=](settle_atom) -> Done {
        Done done;
        auto& s = self->state;
        try {
          s.settle();
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
  };
}

}  // namespace

gradient_reducer_actor spawn_gradient_reducer(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters,
                                              const std::vector<std::unique_ptr<zero::FlatParameters>>& flat,
                                              std::shared_ptr<BucketStaging> staging,
                                              std::shared_ptr<UnitGradStaging> unit_staging,
                                              std::shared_ptr<transport::Communicator> comm) {
  // Every buffer is made here, on the caller's thread, before the actor exists (then it is the
  // actor's): CAF copies spawn arguments, so the state travels in a shared holder.
  auto s = std::make_shared<ReducerState>();
  const auto& plan = *spec->plan;
  const auto options = at::TensorOptions().device(spec->device);
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    const auto& layout = plan.groups()[g].layout;
    const bool partitioned = plan.staged_gradients();
    s->flat.push_back(partitioned ? nullptr : std::make_unique<zero::FlatGradients>(*flat[g]));
    const bool accum = !partitioned && spec->fp32_grad_accumulation;
    s->accum.push_back(accum ? at::zeros({layout.padded_numel}, options.dtype(at::kFloat)) : at::Tensor());
    const auto comm_dtype = spec->comm_dtype(int64_t(g));
    const bool mirror = !partitioned && comm_dtype != (accum ? at::kFloat : spec->dtype);
    s->mirror.push_back(mirror ? at::zeros({layout.padded_numel}, options.dtype(comm_dtype)) : at::Tensor());
    s->reduced.push_back(partitioned ? at::zeros({layout.partition_numel}, options.dtype(spec->accumulation_dtype()))
                                     : at::Tensor());
    const bool fp32 = spec->fp32_master && spec->accumulation_dtype() != at::kFloat;
    s->fp32.push_back(fp32 ? at::zeros({layout.partition_numel}, options.dtype(at::kFloat)) : at::Tensor());
  }
  s->norms = at::zeros({int64_t(parameters.size())}, options.dtype(at::kDouble));
  int64_t largest_partition = 1;
  for (const auto& g : plan.groups()) largest_partition = std::max(largest_partition, g.layout.partition_numel);
  s->norm_scratch = at::empty({std::min<int64_t>(largest_partition, int64_t(1) << 20)}, options.dtype(at::kDouble));
  s->spec = std::move(spec);
  s->parameters = std::move(parameters);
  s->staging = std::move(staging);
  s->unit_staging = unit_staging;
  s->comm = std::move(comm);
  s->tracks_finals = s->spec->optimizer_offload.update == UpdateTiming::during_backward && plan.staged_gradients();
  if (s->tracks_finals) {
    std::vector<std::vector<FinalSubGroups::Range>> subs;
    for (const auto& g : plan.groups()) {
      subs.emplace_back();
      for (const auto& sub : g.sub_groups) subs.back().push_back({sub.begin, sub.end});
    }
    s->finals = FinalSubGroups(std::move(subs), s->written_ranges());
  }
  auto staging_ref = s->staging;  // the actor empties `s` on its own thread
  auto actor = actor_system().spawn<caf::detached>(reducer, std::move(s));
  if (staging_ref) staging_ref->connect(actor);
  if (unit_staging) unit_staging->connect(actor);
  return actor;
}

}  // namespace tessera::actors
