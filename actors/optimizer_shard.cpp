#include "actors/optimizer_shard.h"
#include "actors/partition_weights.h"

#include <ATen/ATen.h>

#include <chrono>
#include <deque>

#include "actors/actor_runtime.h"
#include "actors/ask.h"
#include "actors/core_pool.h"
#include "actors/offload.h"
#include "actors/optimizer_state_placement.h"
#include "actors/parked_reply.h"
#include "actors/weight_departures.h"
#include "core/elapsed.h"
#include "core/error.h"

namespace tessera::actors {
namespace {

struct OptimizerShardState {
  std::shared_ptr<const EngineSpec> spec;
  std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels;  // per flat group
  std::unique_ptr<optim::StateStore> store;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> sub_groups;  // per flat group
  optim::Workspace workspace;
  int64_t updates = 0;
  int64_t updated_this_step = 0;  // sub-groups the step under way has updated (a failure reports it)
  gradient_reducer_actor reducer;
  parameter_shard_actor parameter_shard;
  offload_actor offload;  // optimizer offload only: the host staging
  std::unique_ptr<CorePool> pool;                 // optimizer offload on several threads: the host updates' workers
  std::vector<optim::Workspace> pool_workspaces;  // one per worker
  int64_t staging_slots = 0;
  int64_t staging_bytes = 0;
  zero::ParkedStorages parked;  // offload_states: masters and states moved to host memory
  optim::NvmeStateStore* nvme = nullptr;  // the store, when it is the NVMe one
  optim::SplitStateStore* split = nullptr;  // the store, when only part of it is offloaded (ratio < 1)
  // Update during backward: the boundary backward's early updates, until step() ends them.
  struct Early {
    bool started = false;
    std::vector<optim::StepHyperparameters> hyperparameters;  // what the updates used
    int64_t updated = 0;            // sub-groups updated
    int64_t final_before_step = 0;  // of them, final before step() settled the reductions
    double update_s = 0, wait_s = 0, copy_s = 0;
    std::exception_ptr error;
  } early;

  // Every collective behind a request has its own timeout; this bound only guards against a lost actor.
  std::chrono::milliseconds bound() const { return 3 * spec->timeout + std::chrono::seconds(10); }

  // One host update of a sub-group: on the pool's workers, each stepping its contiguous run
  // (every kernel is elementwise: the bits of one call), or on this thread.
  void host_step(size_t g, const optim::SubGroupState& state, const at::Tensor& grad, const optim::StepHyperparameters& hp) {
    const auto& kernel = *kernels[g];
    if (!pool || kernel.whole_partition()) {
      kernel.step(state.master, grad, state.states, updates + 1, hp, workspace);
      return;
    }
    const int64_t n = grad.numel();
    pool->run([&](int k) {
      const auto [begin, end] = worker_run(n, k, pool->size());
      if (begin >= end) return;
      std::vector<at::Tensor> states;
      for (const auto& t : state.states) states.push_back(t.narrow(0, begin, end - begin));
      kernel.step(state.master.narrow(0, begin, end - begin), grad.narrow(0, begin, end - begin), states, updates + 1, hp,
                  pool_workspaces[size_t(k)]);
    });
  }

  // Whether sub-group s of group g steps on the host (optimizer offload, all or its share).
  bool on_host(size_t g, size_t s) const { return offload && (!split || split->on_host(int64_t(g), int64_t(s))); }

  // The sub-groups that step beside the parameters (all without offload, none with all offloaded),
  // in place; the step count is step()'s.
  void update(const StepRequest& request, const GradientsReady& ready, const PartitionWeights& parameters) {
    const auto& groups = spec->plan->groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& kernel = *kernels[g];
      const auto& hp = request.hyperparameters.at(size_t(groups[g].param_group));
      const auto& grad = ready.partitions.at(g);
      for (size_t s = 0; s < sub_groups[g].size(); ++s) {
        if (on_host(g, s)) continue;
        const auto [begin, end] = sub_groups[g][s];
        auto state = store->acquire(int64_t(g), int64_t(s));
        auto target_param = parameters.acquire(g, begin, end);
        const auto& target = state.master.defined() ? state.master : target_param;
        kernel.step(target, grad.narrow(0, begin, end - begin), state.states, updates + 1, hp, workspace);
        ++updated_this_step;
        if (state.master.defined()) target_param.copy_(state.master);  // round into the parameters' dtype
        parameters.release(g, begin, target_param);
        store->release(int64_t(g), int64_t(s));
      }
    }
  }

  // Optimizer offload: the masters and states are in host memory. Sub-group by sub-group, in the
  // order update() takes them: the gradients come to a host slot (up to staging_slots ahead), the
  // same kernel steps the host master, and the offload actor rounds it into the parameters'
  // dtype and copies it into the device partition while the next sub-group steps. Same inputs,
  // same kernel, same rounding: the bits of update().
  void update_offloaded(const StepRequest& request, const GradientsReady& ready, const PartitionWeights& parameters,
                        StepReport& report) {
    struct Piece { size_t g, s; int64_t begin, end; };
    std::vector<Piece> pieces;
    for (size_t g = 0; g < sub_groups.size(); ++g)
      for (size_t s = 0; s < sub_groups[g].size(); ++s)
        if (on_host(g, s)) pieces.push_back({g, s, sub_groups[g][s].first, sub_groups[g][s].second});
    caf::scoped_actor self{actor_system()};
    std::exception_ptr failure;
    auto fail = [&](const std::string& what) {
      return [&, what](caf::error& e) {
        if (!failure) failure = std::make_exception_ptr(Error("optimizer-shard: the offload actor did not answer (" + what +
                                                              "): " + actor_system().render(e)));
      };
    };
    auto gradients_to_host = [&](size_t i) {
      const auto& p = pieces[i];
      GradientsToHost m{int64_t(i) % staging_slots, ready.partitions.at(p.g).narrow(0, p.begin, p.end - p.begin)};
      return self->request(offload, bound(), to_host_atom::value, std::move(m));
    };
    using InFlight = decltype(gradients_to_host(0));
    std::deque<InFlight> arriving;
    WeightDepartures leaving(self, offload, bound(), parameters, *store, failure);
    // A sub-group stays acquired until its weights have left. In host memory that costs nothing;
    // NVMe keeps few records in memory, so each is released (written back) as soon as its weights
    // are copied, while the next one steps.
    const size_t in_flight = nvme ? 1 : size_t(staging_slots);
    const auto swap_before = nvme ? nvme->stats() : optim::NvmeStoreStats{};
    size_t asked = 0;
    for (; asked < pieces.size() && asked < size_t(staging_slots); ++asked) arriving.push_back(gradients_to_host(asked));
    for (size_t i = 0; i < pieces.size() && !failure; ++i) {
      const auto& p = pieces[i];
      HostGradients grad;
      const auto t0 = std::chrono::steady_clock::now();
      arriving.front().receive([&](HostGradients& h) { grad = std::move(h); }, fail("gradients to the host"));
      arriving.pop_front();
      report.offload_wait_s += seconds_since(t0);
      if (failure) break;
      if (grad.error) {
        failure = grad.error;
        break;
      }
      report.offload_copy_s += grad.copy_s;
      const auto& hp = request.hyperparameters.at(size_t(spec->plan->groups()[p.g].param_group));
      // Acquired until its weights have left (the offload actor reads the master until it replies).
      optim::SubGroupState state;
      try {
        state = store->acquire(int64_t(p.g), int64_t(p.s));
      } catch (...) {
        failure = std::current_exception();
        break;
      }
      try {
        host_step(p.g, state, grad.host, hp);
      } catch (...) {
        failure = std::current_exception();
        store->release(int64_t(p.g), int64_t(p.s));
        break;
      }
      ++updated_this_step;
      // Slot i % staging_slots is free again: ask for the sub-group that uses it next.
      if (asked < pieces.size()) arriving.push_back(gradients_to_host(asked++));
      at::Tensor target;
      try {
        target = parameters.acquire(p.g, p.begin, p.end);
      } catch (...) {
        failure = std::current_exception();
        store->release(int64_t(p.g), int64_t(p.s));
        break;
      }
      leaving.send(int64_t(i) % staging_slots, p.g, p.s, p.begin, state.master, target);
      while (leaving.in_flight() > in_flight && !failure) leaving.take_oldest();
    }
    // Every reply is taken, also after a failure (no copy may outlive the lends).
    for (auto& a : arriving) a.receive([](HostGradients&) {}, fail("gradients to the host"));
    const auto t0 = std::chrono::steady_clock::now();
    leaving.take_all();
    report.offload_wait_s += seconds_since(t0);
    if (nvme) {
      try {
        nvme->flush();  // the step's records are in the file when it returns
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
      report.swap = swap_step(swap_before, nvme->stats());
    }
    if (failure) std::rethrow_exception(failure);
  }

  // Update during backward: while the boundary backward runs, each sub-group the reducer names
  // final comes to the host (one staging slot: the backward is what this overlaps) and the kernel
  // steps its host master; the weights stay as they are (backward still reads them) until
  // write_back() in step(). Same gradients, same kernel, same step count: the bits of
  // update_offloaded().
  void update_during_backward(const StepRequest& request) {
    early = Early{};
    early.started = true;
    early.hyperparameters = request.hyperparameters;
    size_t pieces = 0;
    for (size_t g = 0; g < sub_groups.size(); ++g) {
      pieces += sub_groups[g].size();
      const auto& planned = spec->plan->groups()[g].sub_groups;  // what the reducer names
      bool same = planned.size() == sub_groups[g].size();
      for (size_t k = 0; same && k < planned.size(); ++k)
        same = planned[k].begin == sub_groups[g][k].first && planned[k].end == sub_groups[g][k].second;
      if (!same) {
        early.error = std::make_exception_ptr(Error(
            "tessera.offload.optimizer_during_backward: parameter group " + std::to_string(spec->plan->groups()[g].param_group) +
            "'s optimizer steps whole partitions (a client optimizer run by its own step()); it cannot update sub-groups "
            "during backward"));
        return;
      }
    }
    caf::scoped_actor self{actor_system()};
    auto fail = [&](const char* what) {
      return [&, what](caf::error& e) {
        if (!early.error)
          early.error = std::make_exception_ptr(Error(std::string("optimizer-shard (update during backward): the ") + what +
                                                      " did not answer: " + actor_system().render(e)));
      };
    };
    for (size_t i = 0; i < pieces && !early.error; ++i) {
      FinalGradients final;  // waiting here is waiting for backward, not for offload copies
      self->request(reducer, bound(), next_final_atom::value).receive([&](FinalGradients& f) { final = std::move(f); },
                                                                        fail("gradient-reducer"));
      if (early.error) break;
      if (final.error) {
        early.error = final.error;
        break;
      }
      const size_t g = size_t(final.group), sub = size_t(final.sub);
      if (g >= sub_groups.size() || sub >= sub_groups[g].size() ||
          final.gradients.numel() != sub_groups[g][sub].second - sub_groups[g][sub].first) {
        early.error = std::make_exception_ptr(Error("optimizer-shard (update during backward): sub-group " + std::to_string(sub) +
                                                    " of group " + std::to_string(g) + " is not one of this shard's"));
        break;
      }
      if (!on_host(g, sub)) continue;  // the device's share steps in step(), beside the parameters
      HostGradients host;
      auto t0 = std::chrono::steady_clock::now();
      self->request(offload, bound(), to_host_atom::value, GradientsToHost{0, final.gradients})
          .receive([&](HostGradients& h) { host = std::move(h); }, fail("offload actor"));
      early.wait_s += seconds_since(t0);
      if (early.error) break;
      if (host.error) {
        early.error = host.error;
        break;
      }
      early.copy_s += host.copy_s;
      t0 = std::chrono::steady_clock::now();
      try {
        const auto& hp = request.hyperparameters.at(size_t(spec->plan->groups()[g].param_group));
        auto state = store->acquire(int64_t(g), int64_t(sub));
        host_step(g, state, host.host, hp);
        store->release(int64_t(g), int64_t(sub));
      } catch (...) {
        early.error = std::current_exception();
      }
      early.update_s += seconds_since(t0);
      ++early.updated;
      if (!final.at_settle) ++early.final_before_step;
    }
  }

  // After update_during_backward(): every sub-group's updated host master into the device's
  // parameter partition (rounded by the offload actor), up to staging_slots copies in flight.
  void write_back(const PartitionWeights& parameters, StepReport& report) {
    caf::scoped_actor self{actor_system()};
    std::exception_ptr failure;
    WeightDepartures leaving(self, offload, bound(), parameters, *store, failure);
    const auto t0 = std::chrono::steady_clock::now();
    int64_t i = 0;
    for (size_t g = 0; g < sub_groups.size() && !failure; ++g)
      for (size_t sub = 0; sub < sub_groups[g].size() && !failure; ++sub) {
        if (!on_host(g, sub)) continue;
        const auto [begin, end] = sub_groups[g][sub];
        auto state = store->acquire(int64_t(g), int64_t(sub));
        at::Tensor target;
        try {
          target = parameters.acquire(g, begin, end);
        } catch (...) {
          failure = std::current_exception();
          store->release(int64_t(g), int64_t(sub));
          break;
        }
        leaving.send(i++ % staging_slots, g, sub, begin, state.master, target);
        // On NVMe the records acquired at once must leave buffers for the reads ahead (as update_offloaded).
        while (leaving.in_flight() >= (nvme ? size_t(1) : size_t(staging_slots)) && !failure) leaving.take_oldest();
      }
    leaving.take_all();
    report.offload_wait_s += seconds_since(t0);
    if (nvme) {
      try {
        nvme->flush();  // the step's records are in the file when it returns
      } catch (...) {
        if (!failure) failure = std::current_exception();
      }
    }
    if (failure) std::rethrow_exception(failure);
  }

  // step() after update_during_backward(): the same request, every host sub-group updated once,
  // then the device's share (ratio < 1) in place.
  void finish_early(const StepRequest& request, const GradientsReady& ready, const PartitionWeights& parameters, StepReport& report) {
    auto e = std::exchange(early, Early{});
    updated_this_step = e.updated;  // what a failure below leaves updated
    if (e.error) std::rethrow_exception(e.error);
    size_t pieces = 0;
    for (size_t g = 0; g < sub_groups.size(); ++g)
      for (size_t sub = 0; sub < sub_groups[g].size(); ++sub) pieces += on_host(g, sub) ? 1 : 0;
    if (e.updated != int64_t(pieces))
      throw Error("optimizer-shard (update during backward): " + std::to_string(e.updated) + " of " + std::to_string(pieces) +
                  " host sub-groups were updated");
    for (size_t g = 0; g < request.hyperparameters.size(); ++g) {
      const auto &a = request.hyperparameters[g], &b = e.hyperparameters.at(g);
      if (a.lr != b.lr || a.beta1 != b.beta1 || a.beta2 != b.beta2)
        throw Error("step: parameter group " + std::to_string(g) + "'s lr or betas changed between the boundary backward and "
                    "step() (lr " + std::to_string(b.lr) + " -> " + std::to_string(a.lr) + "); with "
                    "tessera.offload.optimizer_during_backward the update began with the values of the backward's start");
    }
    write_back(parameters, report);
    if (split) update(request, ready, parameters);
    report.offload_wait_s += e.wait_s;
    report.offload_copy_s = e.copy_s;
    report.final_before_step = e.final_before_step;
  }

  static SwapStepStats swap_step(const optim::NvmeStoreStats& before, const optim::NvmeStoreStats& after) {
    SwapStepStats d;
    d.bytes_read = after.io.bytes_read - before.io.bytes_read;
    d.bytes_written = after.io.bytes_written - before.io.bytes_written;
    d.prefetched = after.prefetched - before.prefetched;
    d.waited_reads = after.waited_reads - before.waited_reads;
    d.read_wait_s = after.read_wait_s - before.read_wait_s;
    d.write_wait_s = after.write_wait_s - before.write_wait_s;
    return d;
  }

  // Sizes only (Engine::memory): no tensors, so an NVMe store pages nothing in.
  OptimizerStates sizes() const {
    OptimizerStates out;
    if (split) {
      out.master_bytes = split->device_master_bytes(), out.state_bytes = split->device_state_bytes();
      out.host_master_bytes = split->host_master_bytes(), out.host_state_bytes = split->host_state_bytes();
    } else if (offload) {
      out.host_master_bytes = store->master_bytes(), out.host_state_bytes = store->state_bytes();
    } else {
      out.master_bytes = store->master_bytes(), out.state_bytes = store->state_bytes();
    }
    out.workspace_bytes = workspace.bytes();
    for (const auto& w : pool_workspaces) out.workspace_bytes += w.bytes();
    out.host = bool(offload);
    out.staging_bytes = staging_bytes;
    if (nvme) out.swap_buffer_bytes = nvme->buffer_bytes(), out.swap_file_bytes = nvme->file_bytes();
    out.updates = updates;
    return out;
  }

  int64_t sub_group_count() const {
    int64_t n = 0;
    for (const auto& g : sub_groups) n += int64_t(g.size());
    return n;
  }

  StepReport step(const StepRequest& request) {
    StepReport report;
    updated_this_step = 0;
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
      const PartitionWeights parameters(
          checked(ask<Buffers>(parameter_shard, bound(), "parameter-shard (partitions)", partitions_atom::value)));
      if (early.started) {
        finish_early(request, ready, parameters, report);
      } else if (offload) {
        if (split) update(request, ready, parameters);  // queued first: on a GPU it runs while the host steps
        update_offloaded(request, ready, parameters, report);
      } else {
        update(request, ready, parameters);
      }
      ++updates;
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
    report.sub_groups_updated = updated_this_step + early.updated;
    report.sub_groups = sub_group_count();
    return report;
  }
};

optimizer_shard_actor::behavior_type optimizer_shard(optimizer_shard_actor::stateful_pointer<OptimizerShardState> self,
                                                     std::shared_ptr<OptimizerShardState> init) {
  self->state = std::move(*init);
  if (auto offload = self->state.offload)  // its staging ends with this actor
    self->attach_functor([offload](const caf::error&) { caf::anon_send_exit(offload, caf::exit_reason::user_shutdown); });
  return {
      [=](step_atom, const StepRequest& request) -> StepReport {
        try {
          require_unparked(self->state.parked, "step");
          return self->state.step(request);
        } catch (...) {
          auto& s = self->state;
          StepReport report;
          report.error = std::current_exception();
          report.sub_groups_updated = s.updated_this_step + s.early.updated;
          report.sub_groups = s.sub_group_count();
          s.early = {};  // an update during backward ends with its step, also a failed one
          return report;
        }
      },
      [=](refresh_atom, const RefreshRequest& request) -> Done {
        Done done;
        auto& s = self->state;
        try {
          const PartitionWeights parameters(
              checked(ask<Buffers>(s.parameter_shard, s.bound(), "parameter-shard (partitions)", partitions_atom::value)));
          for (const auto& r : request.ranges) {
            auto master = s.store->partition_master(r.group);
            if (master.defined())
              master.narrow(0, r.begin, r.length).copy_(parameters.acquire(size_t(r.group), r.begin, r.begin + r.length));
          }
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](states_atom) -> OptimizerStates {
        auto& s = self->state;
        OptimizerStates out;
        try {
          std::vector<at::Tensor> masters;
          std::vector<std::vector<at::Tensor>> states;
          for (size_t g = 0; g < s.kernels.size(); ++g) {
            out.state_names.push_back(s.kernels[g]->state_names());
            masters.push_back(s.store->partition_master(int64_t(g)));
            states.push_back(s.store->partition_states(int64_t(g)));
          }
          auto sizes = s.sizes();  // after an NVMe store paged the partitions in
          sizes.state_names = std::move(out.state_names);
          sizes.masters = std::move(masters);
          sizes.states = std::move(states);
          return sizes;
        } catch (...) {
          out.error = std::current_exception();
          return out;
        }
      },
      [=](memory_atom) -> OptimizerStates { return self->state.sizes(); },
      [=](restore_atom, const OptimizerCounters& counters) -> Done {
        self->state.updates = counters.updates;
        return Done{};
      },
      [=](park_atom, const ParkRequest& request) -> Parked {
        return parked_reply([&] {
          auto& s = self->state;
          std::vector<at::Tensor> buffers;
          if (s.split) {  // partial offload: the device's share moves, the host's is there already
            s.split->settle();
            if (request.asks(StateKind::master_weights)) buffers = s.split->device_masters();
            if (request.asks(StateKind::optimizer_states))
              for (const auto& t : s.split->device_states()) buffers.push_back(t);
            return s.parked.park(buffers, request.host);
          }
          if (s.offload) return int64_t(0);  // optimizer offload: masters and states live in host memory already
          for (size_t g = 0; g < s.kernels.size(); ++g) {
            if (request.asks(StateKind::master_weights)) buffers.push_back(s.store->partition_master(int64_t(g)));
            if (request.asks(StateKind::optimizer_states))
              for (const auto& t : s.store->partition_states(int64_t(g))) buffers.push_back(t);
          }
          return s.parked.park(buffers, request.host);
        });
      },
      [=](unpark_atom) -> Parked { return parked_reply([&] { return self->state.parked.unpark(); }); },
      [=](early_atom, const StepRequest& request) {
        auto& s = self->state;
        if (!s.offload) {
          s.early = {};
          s.early.started = true;
          s.early.error = std::make_exception_ptr(Error("optimizer-shard: updates during backward need optimizer offload"));
          return;
        }
        s.update_during_backward(request);  // its errors are step()'s
      },
  };
}

}  // namespace

optimizer_shard_actor spawn_optimizer_shard(std::shared_ptr<const EngineSpec> spec,
                                            std::vector<std::shared_ptr<optim::OptimizerKernel>> kernels,
                                            const std::vector<at::Tensor>& partitions, gradient_reducer_actor reducer,
                                            parameter_shard_actor parameter_shard) {
  auto s = std::make_shared<OptimizerShardState>();
  for (size_t g = 0; g < partitions.size(); ++g) {
    const auto& plan_group = spec->plan->groups()[g];
    std::vector<std::pair<int64_t, int64_t>> subs;
    if (kernels[g]->whole_partition()) {
      subs.push_back({0, plan_group.layout.partition_numel});
    } else {
      for (const auto& sub : plan_group.sub_groups) subs.push_back({sub.begin, sub.end});
    }
    s->sub_groups.push_back(std::move(subs));
  }
  const int64_t host_count = host_sub_groups(*spec, kernels, s->sub_groups);
  const bool host = host_count > 0;  // ratio x count below one sub-group: none offloaded
  int64_t largest_host_sub_group = 0;
  int64_t host_left = host_count;
  for (const auto& subs : s->sub_groups)
    for (size_t k = 0; k < subs.size() && host_left > 0; ++k, --host_left)
      largest_host_sub_group = std::max(largest_host_sub_group, subs[k].second - subs[k].first);
  if (host) {
    OffloadStaging staging;
    // buffer_count slots each way (at least 2: one copying while one steps), no more than there are host sub-groups.
    staging.slots = s->staging_slots =
        std::max<int64_t>(1, std::min(host_count, std::max<int64_t>(2, spec->optimizer_offload.buffer_count)));
    staging.slot_elements = largest_host_sub_group;
    staging.weight_dtype = spec->dtype;
    staging.device = spec->device;
    staging.pin_memory = spec->optimizer_offload.pin_memory;
    s->staging_bytes = staging.bytes(spec->accumulation_dtype());
    s->offload = spawn_offload(staging);
    if (spec->optimizer_offload.threads > 1) {
      s->pool = std::make_unique<CorePool>(spec->optimizer_offload.threads, spec->optimizer_offload.binding);
      s->pool_workspaces.resize(size_t(s->pool->size()));
    }
  }
  auto placed = place_optimizer_states(*spec, kernels, partitions, s->sub_groups, host_count, s->staging_slots);
  s->store = std::move(placed.store);
  s->nvme = placed.nvme;
  s->split = placed.split;
  s->spec = std::move(spec);
  s->kernels = std::move(kernels);
  s->reducer = std::move(reducer);
  s->parameter_shard = std::move(parameter_shard);
  return actor_system().spawn<caf::detached>(optimizer_shard, std::move(s));
}

}  // namespace tessera::actors
