// Engine calls that read or gather the state its actors own: ZeRO-3's gathered-parameters scopes
// (with a modifier rank's write-back), per-parameter gathers, releasing the partition cache, and
// the memory, statistics and storage maps of every stage.
#include <ATen/ATen.h>

#include <algorithm>

#include "actors/ask.h"
#include "actors/engine/engine_impl.h"
#include "actors/engine/storage_description.h"

namespace tessera {

void Engine::for_each_gathered_parameter(const std::function<void(const std::string&, const at::Tensor&)>& f) const {
  auto& s = *impl_;
  s.rethrow_pending();
  s.require_resident("for_each_gathered_parameter");
  auto params = s.module->named_parameters();
  if (!s.stage3) {
    for (const auto& name : s.names) f(name, params[name].detach());
    return;
  }
  const auto& plan = *s.spec->plan;
  for (size_t u = 0; u < plan.units().size(); ++u) {
    s.stage3->pin({int64_t(u)});
    Scope release([&s, u] { s.stage3->unpin({int64_t(u)}); });
    for (int64_t i : plan.units()[u].params) f(s.names[size_t(i)], params[s.names[size_t(i)]].detach());
  }
  for (size_t i = 0; i < s.names.size(); ++i)
    if (plan.persistent(int64_t(i))) f(s.names[i], params[s.names[i]].detach());
}

std::vector<std::vector<std::string>> Engine::gather_groups() const {
  const auto& s = *impl_;
  if (!s.stage3) return {s.names};
  const auto& plan = *s.spec->plan;
  std::vector<std::vector<std::string>> out;
  for (const auto& unit : plan.units()) {
    out.emplace_back();
    for (int64_t i : unit.params) out.back().push_back(s.names[size_t(i)]);
  }
  out.emplace_back();
  for (size_t i = 0; i < s.names.size(); ++i)
    if (plan.persistent(int64_t(i))) out.back().push_back(s.names[i]);
  if (out.back().empty()) out.pop_back();
  return out;
}

void Engine::empty_partition_cache() {
  if (impl_->stage3) impl_->stage3->release_all();
}

Engine::Scope Engine::gathered_parameters(const std::vector<std::string>& names, int modifier_rank) const {
  auto* s = impl_.get();
  s->rethrow_pending();
  s->require_resident("gathered_parameters");
  if (modifier_rank >= 0) {
    s->refuse_during_update("gathered_parameters (with a modifier rank)");
    s->wait_for_snapshot();  // the modifier changes weights an asynchronous save may still copy
  }
  if (modifier_rank >= s->spec->world || modifier_rank < -1)
    throw Error("gathered_parameters: modifier rank " + std::to_string(modifier_rank) + " outside [0, " +
                std::to_string(s->spec->world) + ")");
  if (!s->stage3) return Scope([] {});
  const auto& plan = *s->spec->plan;
  std::vector<int64_t> units;
  bool persistent = names.empty();  // a persistent parameter was named (every one with no names)
  if (names.empty()) {
    for (size_t u = 0; u < plan.units().size(); ++u) units.push_back(int64_t(u));
  } else {
    std::vector<char> wanted(plan.units().size(), 0);
    for (const auto& name : names) {
      const auto it = std::find(s->names.begin(), s->names.end(), name);
      if (it == s->names.end()) throw Error("gathered_parameters: the model has no trainable parameter '" + name + "'");
      const auto [segment, index] = plan.segment_place(int64_t(it - s->names.begin()));
      (void)index;
      const int64_t unit = plan.segments().at(size_t(segment)).unit;
      if (unit >= 0) wanted[size_t(unit)] = 1;  // a persistent parameter is always gathered
      else persistent = true;
    }
    for (size_t u = 0; u < wanted.size(); ++u)
      if (wanted[u]) units.push_back(int64_t(u));
  }
  s->stage3->pin(units);
  // The partition ranges the write-back changes: the units' pieces (and the persistent ones).
  actors::RefreshRequest ranges;
  for (const auto& seg : plan.segments())
    if ((seg.unit >= 0 && std::find(units.begin(), units.end(), seg.unit) != units.end()) || (seg.persistent() && persistent))
      ranges.ranges.push_back({seg.group, seg.partition_offset, seg.layout.partition_numel});
  return Scope([s, units, persistent, modifier_rank, ranges] {
    // Without a modifier rank nothing is written back, and the persistent copies (always
    // gathered, so changed in place) are gathered again from the partitions. A write-back that
    // fails (ranks naming different modifier ranks, a timeout) changed no partition: the
    // persistent copies are gathered again, the units released, and the error raised by close()
    // or kept for the engine's next call.
    using actors::PersistentCopies;
    auto writeback = [&](const std::vector<int64_t>& which, PersistentCopies copies, int root) {
      actors::checked(actors::ask<actors::Done>(s->parameter_shard, s->bound(), "gathered_parameters: the parameter-shard",
                                                actors::writeback_atom::value, actors::WritebackRequest{which, copies, root}));
    };
    const auto copies = persistent ? PersistentCopies::include : PersistentCopies::skip;
    const int none = actors::WritebackRequest::kNoModifier;
    try {
      if (modifier_rank < 0) {
        if (persistent) writeback({}, PersistentCopies::include, none);
      } else {
        writeback(units, copies, modifier_rank);
        if (s->optimizer_shard)
          actors::checked(actors::ask<actors::Done>(s->optimizer_shard, s->bound(), "gathered_parameters: the optimizer-shard",
                                                    actors::refresh_atom::value, ranges));
      }
    } catch (const std::exception& e) {
      try {
        if (persistent) writeback({}, PersistentCopies::include, none);
      } catch (...) {
      }
      s->stage3->unpin(units);
      throw Error("gathered_parameters: writing back the changes of modifier rank " + std::to_string(modifier_rank) +
                  " failed; nothing was changed: " + e.what());
    }
    s->stage3->unpin(units);
  }, [s](std::exception_ptr error) { s->pending = std::move(error); });
}

EngineMemory Engine::memory() const {
  auto& s = *impl_;
  EngineMemory m;
  const auto buffers = actors::checked(actors::ask<actors::Buffers>(s.parameter_shard, s.bound(), "memory: the parameter-shard",
                                                                    actors::buffers_atom::value, actors::BufferContents::sizes));
  // Parameter offload: the partitions (and persistent segments) in host memory, the gathered units
  // on the device; on NVMe the partitions are in the swap file, a few chunks in host buffers.
  (zero::in_host_memory(s.spec->weight_home) ? m.host.parameters : m.parameters) += buffers.weight_bytes;
  m.host.swap_buffers += buffers.swap_buffer_bytes;
  m.nvme += buffers.swap_file_bytes;
  m.parameters += buffers.gathered_bytes;
  if (s.inference) {
    m.parameters -= s.offloaded.parameters;
    m.host.offloaded = s.offloaded.total();
    return m;
  }
  const auto reducer =
      actors::ask<actors::ReducerMemory>(s.reducer, s.bound(), "memory: the gradient-reducer", actors::memory_atom::value);
  m.gradients = reducer.gradients;
  m.scratch = reducer.scratch;
  const auto states = actors::checked(actors::ask<actors::OptimizerStates>(s.optimizer_shard, s.bound(),
                                                                           "memory: the optimizer-shard", actors::memory_atom::value));
  m.master = states.master_bytes;
  m.optimizer_states = states.state_bytes;
  m.host.master = states.host_master_bytes;
  m.host.optimizer_states = states.host_state_bytes;
  if (states.host) {  // optimizer offload: the staging and the kernels' workspace in host memory
    m.host.staging = states.staging_bytes + states.workspace_bytes;
    m.host.swap_buffers += states.swap_buffer_bytes;
    m.nvme += states.swap_file_bytes;
  } else {
    m.scratch += states.workspace_bytes;
  }
  // offload_states: the buffers keep their sizes but their memory is on the host.
  const auto& off = s.offloaded;
  m.parameters -= off.parameters, m.gradients -= off.gradients;
  m.master -= off.master_weights, m.optimizer_states -= off.optimizer_states;
  m.host.offloaded = off.total();
  return m;
}

Stage3Stats Engine::stage3_stats() const {
  auto& s = *impl_;
  Stage3Stats out;
  if (!s.stage3) return out;
  const auto buffers = actors::checked(actors::ask<actors::Buffers>(s.parameter_shard, s.bound(), "stage3_stats: the parameter-shard",
                                                                    actors::buffers_atom::value, actors::BufferContents::sizes));
  const auto& c = buffers.stage3;
  auto counts = [](const actors::FetchCounts& f) { return Stage3FetchCounts{f.fetches, f.prefetched, f.already_gathered}; };
  auto of = [&](actors::FetchKind k) { return counts(c.by_kind[size_t(k)]); };
  const auto total = c.total();
  out.fetches = total.fetches, out.prefetched = total.prefetched, out.already_gathered = total.already_gathered;
  out.scope = of(actors::FetchKind::scope), out.forward_no_grad = of(actors::FetchKind::forward_no_grad);
  out.forward = of(actors::FetchKind::forward), out.backward = of(actors::FetchKind::backward);
  out.prefetch_issued = c.prefetch_issued, out.divergences = c.divergences, out.kept_for_reuse = c.kept_for_reuse;
  out.peak_gathered_bytes = c.peak_gathered_bytes, out.gathered_wire_bytes = c.gathered_wire_bytes;
  out.fetch_wait_s = s.stage3->fetch_wait_s();
  return out;
}

EngineStorage Engine::storage_maps() const {
  auto& s = *impl_;
  s.require_resident("storage_maps");
  const auto buffers = actors::checked(actors::ask<actors::Buffers>(s.parameter_shard, s.bound(), "storage_maps: the parameter-shard",
                                                                    actors::buffers_atom::value, actors::BufferContents::tensors));
  if (s.inference) return actors::describe_storage(*s.spec, buffers, actors::OptimizerStates{});  // weights only
  const auto states = actors::checked(actors::ask<actors::OptimizerStates>(s.optimizer_shard, s.bound(),
                                                                           "storage_maps: the optimizer-shard", actors::states_atom::value));
  return actors::describe_storage(*s.spec, buffers, states);
}

EngineStorage Engine::weight_storage_maps() const {
  auto& s = *impl_;
  s.require_resident("weight_storage_maps");
  const auto buffers = actors::checked(actors::ask<actors::Buffers>(s.parameter_shard, s.bound(), "weight_storage_maps: the parameter-shard",
                                                                    actors::buffers_atom::value, actors::BufferContents::tensors));
  return actors::describe_storage(*s.spec, buffers, actors::OptimizerStates{});
}

}  // namespace tessera
