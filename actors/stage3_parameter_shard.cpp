// The ZeRO-3 parameter-shard (parameter_shard.h): gathers units on demand and ahead of demand.
//
// Order check: every gather of a unit (or of the persistent segments after an update) is preceded,
// on the same communicator, by an all-gather of a 3-number header (unit, gather number, elements).
// Ranks that gather different units at the same point (a model whose ranks run different modules)
// get an error naming the ranks, their units and the gather number instead of a hang or a silent
// mix of two units' pieces. The header is checked before the unit's data is used; its collective
// runs ahead of the data's in the communicator's order, so the check costs one small collective
// and no extra round trip.
//
// Prefetch and reuse: what goes ahead of demand and what stays gathered after a use is the
// GatherSchedule's (gather_schedule.h: the first window's fetches are the record, later windows
// follow it within stage3_prefetch_bucket_size, stage3_max_live_parameters and
// stage3_max_reuse_distance); this actor gathers and releases accordingly. Fetches of
// gathered-parameters scopes are outside the order. A fetch that leaves the record stops
// prefetching for the rest of that window (said once) and releases what was gathered ahead. A
// ZeRO inference engine has no updates: its windows are its Engine::forward calls.
//
// Precision: with torch_autocast, gathers for forwards run under CPU autocast (and for the
// backwards of those forwards) carry lower-precision-safe groups in bf16, widened into the fp32
// unit: the values autocast's own cast gives, so results do not change. Everything else gathers
// exactly: gathered-parameters scopes, the persistent parameters, a forward without autocast (a
// unit still gathered in bf16 is then gathered again).
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <set>

#include "actors/actor_runtime.h"
#include "actors/gather_schedule.h"
#include "actors/parameter_shard.h"
#include "actors/parked_reply.h"
#include "core/error.h"
#include "core/log/log.h"

namespace tessera::actors {
namespace {

constexpr int64_t kPersistent = -2;  // the header's unit for the persistent segments' gather
constexpr int64_t kWriteback = -3;   // the header's unit for a write-back's broadcasts

struct Inflight {
  int64_t number = 0;                // gather number
  std::vector<int64_t> expected;     // this rank's header
  at::Tensor headers;                // every rank's header (W x 3)
  std::shared_ptr<transport::Work> header_work;
  std::vector<std::shared_ptr<transport::Work>> works;
  std::vector<std::pair<at::Tensor, at::Tensor>> widen;  // (bf16 gathered segment, its fp32 target) after the works
};

struct Stage3ShardState {
  std::shared_ptr<const EngineSpec> spec;
  std::unique_ptr<zero::Stage3Parameters> params;
  std::shared_ptr<transport::Communicator> comm;
  int64_t gathers = 0;                 // every rank numbers its gathers alike
  std::map<int64_t, Inflight> inflight;  // by unit (kPersistent: the persistent segments)
  std::exception_ptr pending;          // a failure found while releasing, reported by the next request
  std::set<int64_t> abandoned_units;   // their gather failed (see complete())
  std::set<int64_t> ahead_units;       // gathered ahead, not asked for yet
  std::set<int64_t> rounded_units;     // gathered (or on their way) in bf16 under torch_autocast
  std::set<int64_t> autocast_forward;  // units whose last forward ran under autocast
  bool round_ahead = false;            // prefetches in bf16 (the last fetch could take bf16)
  std::vector<Inflight> abandoned;
  // The record and where the current window is in it.
  std::unique_ptr<GatherSchedule> schedule;  // the record, where the window is, what goes ahead
  bool warned = false;
  Stage3Counters counters;
  zero::ParkedStorages parked;  // offload_states: the weight buffers (partitions, persistent segments) in host memory

  const zero::ShardingPlan& plan() const { return *spec->plan; }
  int64_t numel(int64_t unit) const { return plan().units()[size_t(unit)].gathered_numel; }
  // Elements of every unit gathered (or on its way) now: what stage3_max_live_parameters bounds.
  int64_t live_elements() const { return params->gathered_bytes() / int64_t(c10::elementSize(spec->dtype)); }
  std::string unit_name(int64_t unit) const {
    if (unit == kPersistent) return "(the persistent parameters)";
    if (unit == kWriteback) return "(a gathered-parameters write-back)";
    if (unit < 0 || size_t(unit) >= plan().units().size()) return "#" + std::to_string(unit);
    const auto& m = plan().units()[size_t(unit)].module;
    return "'" + (m.empty() ? std::string("(root)") : m) + "'";
  }

  // Issues the header and the segments' gathers into `targets` (segment index, gathered view),
  // each in its group's gather dtype unless `exact`.
  // A write-back's header carries its modifier rank where a gather's carries its bytes.
  Inflight issue(int64_t unit, const std::vector<std::pair<int64_t, at::Tensor>>& targets, bool exact = true,
                 int64_t root = -1) {
    Inflight f;
    f.number = ++gathers;
    int64_t bytes = 0;
    for (const auto& [index, gathered] : targets) {
      const auto wire = exact ? spec->dtype : spec->gather_dtype(plan().segments()[size_t(index)].group);
      bytes += gathered.numel() * int64_t(c10::elementSize(wire));
    }
    counters.gathered_wire_bytes += bytes;
    f.expected = {unit, f.number, unit == kWriteback ? root : bytes};
    if (comm) {
      auto mine = at::tensor(f.expected, at::TensorOptions().dtype(at::kLong));
      f.headers = at::empty({int64_t(comm->size()) * 3}, mine.options());
      f.header_work = comm->all_gather(mine, f.headers);
    }
    // The data moves only if every rank's header matched: ranks gathering different units would
    // exchange buffers of different sizes, which Gloo answers by aborting the process.
    transport::OpOptions guarded;
    if (comm)
      guarded.precondition = [headers = f.headers, expected = f.expected] {
        return headers_match(headers, expected) ? std::string()
                                                : std::string("the ranks gather different units (the header check says which)");
      };
    for (const auto& [index, gathered] : targets) {
      const auto& s = plan().segments()[size_t(index)];
      const auto wire = exact ? spec->dtype : spec->gather_dtype(s.group);
      auto buffer = wire == gathered.scalar_type() ? gathered : at::empty({gathered.numel()}, gathered.options().dtype(wire));
      params->read_piece(index, buffer.narrow(0, s.layout.partition_begin(spec->rank), s.layout.partition_numel));
      if (comm) f.works.push_back(comm->all_gather_in_place(buffer, guarded));
      if (!buffer.is_same(gathered)) f.widen.emplace_back(buffer, gathered);
    }
    return f;
  }

  // Whether every rank's header (all-gathered, 3 numbers each) is `expected`.
  static bool headers_match(const at::Tensor& headers, const std::vector<int64_t>& expected) {
    auto h = headers.accessor<int64_t, 1>();
    for (int64_t i = 0; i < headers.numel(); ++i)
      if (h[i] != expected[size_t(i % 3)]) return false;
    return true;
  }

  void check(const Inflight& f) const {
    if (headers_match(f.headers, f.expected)) return;
    auto h = f.headers.accessor<int64_t, 1>();
    bool writebacks = true;
    std::string roots;
    for (int r = 0; r < comm->size(); ++r) {
      writebacks = writebacks && h[r * 3] == kWriteback;
      roots += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " names " + std::to_string(h[r * 3 + 2]);
    }
    if (writebacks)
      throw Error("ZeRO-3: the ranks end a gathered-parameters scope with different modifier ranks (" + roots +
                  "); every rank must pass the same modifier_rank");
    std::string ranks;
    for (int r = 0; r < comm->size(); ++r)
      ranks += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " unit " + unit_name(h[r * 3]) +
               " (its gather #" + std::to_string(h[r * 3 + 1]) + ", " +
               (h[r * 3] == kWriteback ? "modifier rank " + std::to_string(h[r * 3 + 2])
                                       : std::to_string(h[r * 3 + 2]) + " bytes") + ")";
    throw Error("ZeRO-3: the data-parallel ranks gather different units at gather #" + std::to_string(f.number) + ": " +
                ranks + ". Every rank must run the same modules in the same order; a block that routes its input "
                "to different submodules on different ranks (mixture of experts) must be a leaf module "
                "(zero_optimization.leaf_module), which is gathered whole");
  }

  // Waits for an issued gather. A unit whose gather failed is abandoned, never released: its
  // collective may still be writing into it (the communicator keeps the tensors alive; releasing
  // would free the memory under it), and the engine cannot go on anyway.
  void complete(int64_t unit) {
    auto it = inflight.find(unit);
    if (it == inflight.end()) return;
    Inflight f = std::move(it->second);
    inflight.erase(it);
    try {
      if (f.header_work) {
        f.header_work->wait();
        check(f);
      }
      for (auto& w : f.works) w->wait();
      for (auto& [low, target] : f.widen) target.copy_(low);
    } catch (...) {
      abandoned_units.insert(unit);
      abandoned.push_back(std::move(f));
      throw;
    }
  }

  std::vector<std::pair<int64_t, at::Tensor>> unit_targets(int64_t unit) {
    auto alias = params->materialize(unit);
    std::vector<std::pair<int64_t, at::Tensor>> targets;
    for (int64_t index : plan().units()[size_t(unit)].segments) {
      const auto& s = plan().segments()[size_t(index)];
      targets.emplace_back(index, alias.narrow(0, s.gathered_offset, s.layout.padded_numel));
    }
    return targets;
  }

  // A forward's or backward's gather (in the gather dtype), or an exact one.
  void start(int64_t unit, bool exact = false) {
    bool rounded = false;
    for (int64_t index : plan().units()[size_t(unit)].segments)
      rounded = rounded || (!exact && spec->gather_dtype(plan().segments()[size_t(index)].group) != spec->dtype);
    if (rounded) rounded_units.insert(unit);
    else rounded_units.erase(unit);
    params->prefetch_pieces(unit);  // parameters on NVMe: every chunk of the unit's pieces read at once
    inflight.emplace(unit, issue(unit, unit_targets(unit), exact));
    counters.peak_gathered_bytes = std::max(counters.peak_gathered_bytes, params->gathered_bytes());
  }

  void rethrow_pending() {
    if (pending) std::rethrow_exception(std::exchange(pending, nullptr));
  }

  // A fetch (protocol.h): a scope's is outside the order and exact; the others follow the record.
  void fetch(const FetchRequest& request) {
    rethrow_pending();
    const int64_t unit = request.unit;
    const FetchKind kind = request.kind;
    bool ordered = kind != FetchKind::scope;
    if (unit < 0 || size_t(unit) >= plan().units().size())
      throw Error("ZeRO-3: fetch of unit " + std::to_string(unit) + " of " + std::to_string(plan().units().size()));
    auto& of_kind = counters.by_kind[size_t(kind)];
    ++of_kind.fetches;
    if (schedule->fetch(unit, ordered) == GatherSchedule::Step::left) {
      if (!warned && spec->rank == 0) {
        const int64_t recorded = schedule->recorded_at_left();
        log::warn(std::string("ZeRO-3: ") + (spec->forward_windows ? "forward" : "update") + " window " +
                  std::to_string(schedule->windows()) + " left the recorded module order at fetch " +
                  std::to_string(schedule->left_at()) + " (recorded " +
                  (recorded >= 0 ? unit_name(recorded) : std::string("(the end)")) + ", now " + unit_name(unit) +
                  "); gathering on demand for the rest of the window");
      }
      warned = true;
      ++counters.divergences;
      // Units gathered ahead for the record's next steps will not be asked for now.
      for (int64_t u : std::vector<int64_t>(ahead_units.begin(), ahead_units.end()))
        if (u != unit) release(u);
      ahead_units.clear();
    }
    const bool was_ahead = ahead_units.erase(unit) > 0;
    if (inflight.count(unit) || was_ahead) {
      ++of_kind.prefetched;
      if (inflight.count(unit)) complete(unit);
    } else if (params->gathered(unit)) {
      ++of_kind.already_gathered;
    }
    // bf16 will do for a forward under autocast, and for the backward of one.
    bool bf16_ok = false;
    if (kind == FetchKind::backward) {
      bf16_ok = autocast_forward.count(unit) > 0;
    } else if (kind != FetchKind::scope) {
      bf16_ok = request.autocast == Autocast::on;
      if (bf16_ok) autocast_forward.insert(unit);
      else autocast_forward.erase(unit);
    }
    round_ahead = bf16_ok;
    if (!params->gathered(unit)) {
      start(unit, /*exact=*/!bf16_ok);
      complete(unit);
    } else if (!bf16_ok && rounded_units.count(unit)) {  // gathered in bf16, wanted exact: again
      start(unit, /*exact=*/true);
      complete(unit);
    }
  }

  // Whether the units recorded next are gathered ahead after this fetch's reply: after a forward
  // with grad and before a backward (training), and after every forward of ZeRO inference. Not
  // after a forward without grad in training (an eval would leave its prefetches gathered: no
  // backward follows), nor after a scope's.
  bool prefetches_after(FetchKind kind) const {
    switch (kind) {
      case FetchKind::forward:
      case FetchKind::backward: return true;
      case FetchKind::forward_no_grad: return spec->forward_windows;
      case FetchKind::scope: return false;
    }
    return false;
  }

  // Gathers ahead along the record (after a fetch's reply went out), as the schedule says.
  void prefetch() {
    int64_t ahead = 0;
    for (const auto& [u, f] : inflight)
      if (u >= 0) ahead += numel(u);
    for (int64_t u : schedule->ahead([&](int64_t v) { return params->gathered(v); }, ahead, live_elements())) {
      try {
        start(u, /*exact=*/!round_ahead);
      } catch (...) {
        pending = std::current_exception();
        return;
      }
      ahead_units.insert(u);
      ++counters.prefetch_issued;
    }
  }

  // After a use: released, unless it is reused soon and the live bound allows keeping it.
  void release_after_use(int64_t unit) {
    if (params->gathered(unit) && !inflight.count(unit) && live_elements() <= spec->max_live_elements &&
        schedule->reused_soon(unit)) {
      ++counters.kept_for_reuse;
      return;
    }
    release(unit);
  }

  // Forward windows (ZeRO inference): the first is recorded, later ones follow it. At a window's
  // end the units gathered ahead and not asked for are released (the driver releases the rest).
  void window(bool begin) {
    if (begin) return schedule->begin_window();
    schedule->end_window();
    for (int64_t u : std::vector<int64_t>(ahead_units.begin(), ahead_units.end())) release(u);
    ahead_units.clear();
  }

  void release(int64_t unit) {
    if (abandoned_units.count(unit)) return;
    ahead_units.erase(unit);
    rounded_units.erase(unit);
    if (inflight.count(unit)) {
      try {
        complete(unit);
      } catch (...) {
        if (!pending) pending = std::current_exception();
      }
    }
    if (!abandoned_units.count(unit)) params->release(unit);
  }

  // A modifier rank's changes to gathered units (and to the persistent copies) become everybody's:
  // broadcast from `root`, then each rank's pieces go back into its partitions.
  void writeback(const WritebackRequest& request) {
    rethrow_pending();
    const auto& units = request.units;
    const bool persistent_too = request.persistent == PersistentCopies::include;
    const int root = request.modifier_rank;
    std::vector<std::pair<int64_t, at::Tensor>> buffers;  // (unit or kPersistent group marker, buffer)
    for (int64_t u : units) {
      if (u < 0 || size_t(u) >= plan().units().size() || !params->gathered(u) || inflight.count(u))
        throw Error("ZeRO-3: write-back of unit " + unit_name(u) + ", which is not gathered");
      buffers.emplace_back(u, params->alias(u));
    }
    for (size_t g = 0; g < plan().groups().size() && persistent_too; ++g) {
      auto persistent = params->persistent_segment(int64_t(g));
      if (persistent.defined()) buffers.emplace_back(kPersistent, persistent);
    }
    if (root == WritebackRequest::kNoModifier) {  // the persistent copies again as the partitions hold them
      if (persistent_too) gather_persistent_segments();
      return;
    }
    if (comm) {
      Inflight f = issue(kWriteback, {}, true, root);  // the header only: every rank at a write-back from `root`
      f.header_work->wait();
      check(f);
      std::vector<std::shared_ptr<transport::Work>> works;
      for (auto& [u, buffer] : buffers) works.push_back(comm->broadcast(buffer, root));
      for (auto& w : works) w->wait();
    }
    // This rank's piece of each gathered segment back into the partition.
    auto keep_piece = [&](int64_t index, const at::Tensor& gathered) {
      const auto& s = plan().segments()[size_t(index)];
      params->write_piece(index, gathered.narrow(0, s.layout.partition_begin(spec->rank), s.layout.partition_numel));
    };
    for (int64_t u : units)
      for (int64_t index : plan().units()[size_t(u)].segments)
        keep_piece(index, params->alias(u).narrow(0, plan().segments()[size_t(index)].gathered_offset,
                                                  plan().segments()[size_t(index)].layout.padded_numel));
    for (size_t g = 0; g < plan().groups().size() && persistent_too; ++g) {
      const int64_t index = persistent_index(int64_t(g));
      if (index >= 0) keep_piece(index, params->persistent_segment(int64_t(g)));
    }
  }

  // Flat group g's persistent segment, or -1.
  int64_t persistent_index(int64_t g) const {
    for (int64_t index : plan().groups()[size_t(g)].segments)
      if (plan().segments()[size_t(index)].persistent()) return index;
    return -1;
  }

  void gather_persistent() {
    rethrow_pending();
    gather_persistent_segments();
    // An update ends a window: the first one's fetches are the record; the next window follows it.
    schedule->end_update();
  }

  void gather_persistent_segments() {
    std::vector<std::pair<int64_t, at::Tensor>> targets;
    for (size_t g = 0; g < plan().groups().size(); ++g) {
      const int64_t index = persistent_index(int64_t(g));
      if (index >= 0) targets.emplace_back(index, params->persistent_segment(int64_t(g)));
    }
    inflight.emplace(kPersistent, issue(kPersistent, targets));
    complete(kPersistent);
  }
};

parameter_shard_actor::behavior_type stage3_shard(parameter_shard_actor::stateful_pointer<Stage3ShardState> self,
                                                  std::shared_ptr<Stage3ShardState> init) {
  self->state = std::move(*init);
  return {
      [=](partitions_atom) -> Buffers {
        Buffers out;
        auto& st = self->state;
        try {
          if (st.params->swap()) {  // on NVMe: the optimizer reads and writes sub-group by sub-group
            st.params->settle_lent();
            out.swap = st.params->shared_swap();
            return out;
          }
          for (size_t g = 0; g < st.plan().groups().size(); ++g) out.tensors.push_back(st.params->partition(int64_t(g)));
        } catch (...) {
          out.error = std::current_exception();
        }
        return out;
      },
      [=](gather_atom) -> Done {
        Done done;
        try {
          require_unparked(self->state.parked, "the persistent parameters' all-gather");
          self->state.gather_persistent();
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](buffers_atom, BufferContents contents) -> Buffers {
        Buffers out;
        auto& st = self->state;
        try {  // parameters on NVMe: paged in from the swap, whose reads can fail
          if (contents == BufferContents::tensors)
            for (size_t g = 0; g < st.plan().groups().size(); ++g) out.tensors.push_back(st.params->weight_buffer(int64_t(g)));
        } catch (...) {
          out.error = std::current_exception();
        }
        out.weight_bytes = st.params->resident_weight_bytes();
        if (const auto* swap = st.params->swap()) out.swap_buffer_bytes = swap->buffer_bytes(), out.swap_file_bytes = swap->file_bytes();
        out.gathered_bytes = st.params->gathered_bytes();
        out.stage3 = st.counters;
        return out;
      },
      [=](fetch_atom, const FetchRequest& request) -> caf::typed_response_promise<Done> {
        auto& st = self->state;
        auto promise = self->make_response_promise<Done>();
        Done done;
        try {
          require_unparked(st.parked, "a ZeRO-3 gather (forward or backward)");
          st.fetch(request);
        } catch (...) {
          done.error = std::current_exception();
        }
        promise.deliver(done);  // the user's thread goes on while the next units are issued
        if (!done.error && st.prefetches_after(request.kind)) st.prefetch();
        return promise;
      },
      [=](writeback_atom, const WritebackRequest& request) -> Done {
        Done done;
        try {
          require_unparked(self->state.parked, "a gathered-parameters write-back");
          self->state.writeback(request);
        } catch (...) {
          done.error = std::current_exception();
        }
        return done;
      },
      [=](release_atom, const ReleaseRequest& request) {
        auto& st = self->state;
        if (request.unit == ReleaseRequest::kEveryUnit) {
          for (size_t u = 0; u < st.plan().units().size(); ++u) st.release(int64_t(u));
        } else if (request.unit >= 0 && size_t(request.unit) < st.plan().units().size()) {
          if (request.kind == ReleaseKind::after_use) st.release_after_use(request.unit);
          else st.release(request.unit);
        }
      },
      [=](window_atom, WindowEdge edge) { self->state.window(edge == WindowEdge::begin); },
      [=](park_atom, const ParkRequest& request) -> Parked {
        return parked_reply([&] {
          auto& st = self->state;
          if (!request.asks(StateKind::parameters)) return int64_t(0);
          if (!st.inflight.empty()) throw Error("offload_states: ZeRO-3 gathers are still in flight");
          for (size_t u = 0; u < st.plan().units().size(); ++u) st.release(int64_t(u));
          if (st.params->gathered_bytes() != 0)
            throw Error("offload_states: a ZeRO-3 unit is still gathered (call it outside gathered_parameters())");
          // Parameter offload: the weight buffers live in host memory already; the units were what the device held.
          if (zero::in_host_memory(st.params->home())) return int64_t(0);
          std::vector<at::Tensor> buffers;
          for (size_t g = 0; g < st.plan().groups().size(); ++g) buffers.push_back(st.params->weight_buffer(int64_t(g)));
          return st.parked.park(buffers, request.host);
        });
      },
      [=](unpark_atom) -> Parked { return parked_reply([&] { return self->state.parked.unpark(); }); },
  };
}

}  // namespace

parameter_shard_actor spawn_stage3_parameter_shard(std::shared_ptr<const EngineSpec> spec,
                                                   std::unique_ptr<zero::Stage3Parameters> parameters,
                                                   std::shared_ptr<transport::Communicator> comm) {
  auto s = std::make_shared<Stage3ShardState>();
  s->spec = std::move(spec);
  std::vector<int64_t> elements;
  for (const auto& unit : s->spec->plan->units()) elements.push_back(unit.gathered_numel);
  s->schedule = std::make_unique<GatherSchedule>(
      std::move(elements),
      GatherLimits{s->spec->prefetch_elements, s->spec->max_live_elements, s->spec->max_reuse_elements},
      s->spec->forward_windows);
  s->params = std::move(parameters);
  s->comm = std::move(comm);
  return actor_system().spawn<caf::detached>(stage3_shard, std::move(s));
}

}  // namespace tessera::actors
