// RolloutSink (weight_sync.h): the rollout side of a sync, run by the rollout-sink actor.
#include <torch/torch.h>

#include <condition_variable>
#include <mutex>

#include "actors/ask.h"
#include "actors/rollout/rollout_sink_actor.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/sync_link.h"
#include "actors/rollout/weight_sync.h"
#include "core/affine/delta_packet.h"
#include "core/affine/serialize.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "core/nn/tensor_parallel.h"
#include "core/nn/tp_maps.h"
#include "transport/store.h"
#include "transport/ucx/ucx_memory.h"

namespace tessera {
namespace {

// What the actor and the facade share: the link (used only on the actor's thread after
// construction), and what listening has produced so far (under `mutex`).
struct SinkCore {
  std::unique_ptr<SyncLink> link;
  RolloutEngine* rollout = nullptr;
  std::vector<size_t> param_index;               // per plan: its position in module()->parameters()
  std::vector<std::vector<uint8_t>> received;    // per training rank: its delta packet to this rank
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);  // the actor's SinkWork::stop

  std::mutex mutex;
  std::condition_variable changed;
  uint64_t latest_version = 0;  // staged or published by the last good sync
  uint64_t failures = 0;
  std::exception_ptr last_error;
  WeightSyncStats last_stats;

  WeightSyncStats receive(bool listening);
  void record(const WeightSyncStats* stats, std::exception_ptr error);
};

// Drops a lent standby set on any exit but a verified one.
struct StandbyLease {
  RolloutEngine* rollout = nullptr;
  ~StandbyLease() {
    if (rollout) rollout->standby_written(false);
  }
};

WeightSyncStats SinkCore::receive(bool listening) {
  auto& l = *link;
  WeightSyncStats stats;
  stats.plan_ms = l.plan_once();
  if (!l.wait_for_start(l.options.timeout, listening ? stop.get() : nullptr)) return stats;  // stopped
  const bool double_buffered = l.options.mode == SinkMode::double_buffered;
  auto live = rollout->model().module()->parameters();
  std::vector<at::Tensor> written;
  StandbyLease lease;
  if (double_buffered) {
    written = rollout->standby_for_writing(l.options.timeout);
    lease.rollout = rollout;
  } else {
    for (auto& p : live) written.push_back(p);
  }
  auto batch = l.batch_skeleton();
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = written[param_index[i]];
    batch[i].target_buffers[l.rank] = {p.data_ptr(), p.numel(), l.targets[i].dtype};
  }
  std::vector<std::vector<int64_t>> sizes;
  if (l.delta_now()) sizes = l.agree_on_packets({});
  // In place, generation pauses from the moment this process accepts the transfer (peers may
  // write into it from then on) until the sync is verified; a batch refused or withdrawn before
  // any byte moved leaves the weights serving, torn only if they were before.
  auto paused = std::chrono::steady_clock::now();
  const bool torn_before = rollout->weights_torn();
  transport::TransferHooks hooks;
  hooks.exposed = [&] {
    paused = std::chrono::steady_clock::now();
    if (!double_buffered) rollout->mark_weights_torn();
  };
  hooks.withdrawn = [&] {
    if (!double_buffered && !torn_before) rollout->unmark_weights_torn();
  };
  const auto t = std::chrono::steady_clock::now();
  transport::RemoteTransferStats s;
  if (!sizes.empty()) {
    // A delta builds on the last verified version: the live weights, which the standby copies first.
    if (double_buffered) {
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < live.size(); ++i) written[i].copy_(live[i]);
    }
    auto packets = l.packet_batch(sizes);
    received.resize(size_t(l.train_size()));
    for (size_t i = 0; i < packets.size(); ++i)
      if (l.packet_pairs[i].second == l.rank) {
        auto& packet = received[size_t(l.packet_pairs[i].first)];
        packet.resize(size_t(sizes[size_t(l.packet_pairs[i].first)][size_t(l.rank)]));
        packets[i].target_buffers[0] = {packet.data(), int64_t(packet.size()), affine::DType::u8};
      }
    s = l.executor->execute(packets, hooks);
    const auto a = std::chrono::steady_clock::now();
    for (int src = 0; src < l.train_size(); ++src) {
      const auto bytes = size_t(sizes[size_t(src)][size_t(l.rank)]);
      if (bytes == 0) continue;
      size_t cursor = 0;
      for (size_t i = 0; i < l.plans.size(); ++i)
        cursor = affine::apply_delta(l.plans[i], src, l.rank, received[size_t(src)].data(), bytes, cursor,
                                     batch[i].target_buffers.at(l.rank));
      if (cursor != bytes)
        throw TransportError("weight sync '" + l.options.session + "': the delta packet from training rank " +
                             std::to_string(src) + " has " + std::to_string(bytes - cursor) + " bytes past its end");
    }
    stats.pack_ms = ms_since(a);
    stats.delta = true;
  } else {
    s = l.executor->execute(batch, hooks);
  }
  stats.sync_ms = ms_since(t);
  stats.bytes_sent = s.bytes_received, stats.puts = s.puts, stats.wire_to_useful = s.wire_to_useful;
  stats.staging_peak_bytes = s.staging_peak_bytes;
  if (l.options.tamper_for_testing)
    for (size_t i = 0; i < l.plans.size(); ++i) l.options.tamper_for_testing(l.plans[i].name, written[param_index[i]]);
  const auto v = std::chrono::steady_clock::now();
  const auto failures = l.all_verdicts(l.verify_target_digests(batch));
  stats.verify_ms = ms_since(v);
  ++l.syncs;
  if (!failures.empty())
    throw TransportError("weight sync '" + l.options.session + "': sync " + std::to_string(l.syncs) +
                         " failed verification, " +
                         (double_buffered ? "dropped; version " + std::to_string(rollout->weight_version()) + " keeps serving"
                                          : std::string("generation paused until a good sync")) +
                         ": " + failures);
  if (double_buffered) {
    lease.rollout = nullptr;
    stats.version = rollout->standby_written(true);
  } else {
    stats.version = rollout->publish_synced_weights();
    stats.pause_ms = ms_since(paused);
  }
  return stats;
}

void SinkCore::record(const WeightSyncStats* stats, std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (stats) latest_version = stats->version, last_stats = *stats;
    if (error) ++failures, last_error = error;
  }
  changed.notify_all();
}

// One region of UCX-allocated memory holding a rank's rollout weights (and, double-buffered, the
// standby copy): its flat weight storage. On one machine UCX places it in shared memory, so the
// training ranks' puts land with one copy (a heap buffer gets emulated puts: bench/sync measured
// about 70-270 MiB/s for those). Tensors made on it keep it, and the UCX context it needs, alive.
struct WeightRegion {
  std::shared_ptr<transport::UcxContext> context;
  std::shared_ptr<transport::UcxMemory> memory;
  ~WeightRegion() { memory.reset(); }  // before the context
};

// Moves the parameters (in named_parameters order) into `sets` consecutive copies of one region:
// set 0 becomes the live weights, set 1 (if any) is returned as the standby set.
std::vector<at::Tensor> place_in_ucx_memory(SyncLink& link, RolloutEngine& rollout, int sets) {
  constexpr int64_t kAlign = 64;
  auto params = rollout.model().module()->parameters();
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (const auto& p : params) {
    offsets.push_back(total);
    total += (int64_t(p.nbytes()) + kAlign - 1) / kAlign * kAlign;
  }
  auto region = std::make_shared<WeightRegion>();
  region->context = link.context;
  region->memory = transport::UcxMemory::allocate(*link.context, size_t(std::max<int64_t>(total * sets, kAlign)));
  link.executor->use_registered(region->memory);
  auto* base = static_cast<uint8_t*>(region->memory->address());
  std::vector<at::Tensor> standby;
  torch::NoGradGuard no_grad;
  for (int set = 0; set < sets; ++set)
    for (size_t i = 0; i < params.size(); ++i) {
      auto t = torch::from_blob(base + set * total + offsets[i], params[i].sizes(), [region](void*) {},
                                params[i].options().requires_grad(false));
      if (set == 0) {
        t.copy_(params[i].detach());
        params[i].set_data(t);
      } else {
        standby.push_back(t);
      }
    }
  return standby;
}

}  // namespace

struct RolloutSink::Impl {
  std::shared_ptr<SinkCore> core;
  actors::rollout_sink_actor actor;
  bool listening = false;
};

RolloutSink::RolloutSink(RolloutEngine& rollout, const WeightSyncOptions& options) : impl_(std::make_unique<Impl>()) {
  auto core = std::make_shared<SinkCore>();
  core->rollout = &rollout;
  core->link = std::make_unique<SyncLink>(options, false, rollout.tp_rank(), rollout.tp_size());
  auto& link = *core->link;
  const auto& config = rollout.config();
  const auto wire = affine_dtype(rollout.dtype(), "the rollout engine's dtype");
  if (link.rank == 0) link.shared->set("rollout_dtype", affine::dtype_name(wire));
  link.agree_on_config(nn::decoder_config_json(config));
  link.connect();
  const bool double_buffered = options.mode == SinkMode::double_buffered;
  auto standby = place_in_ucx_memory(link, rollout, double_buffered ? 2 : 1);
  if (double_buffered) rollout.adopt_standby(std::move(standby));
  std::map<std::string, size_t> position;
  size_t n = 0;
  for (const auto& item : rollout.model().module()->named_parameters()) position[item.key()] = n++;
  for (const auto& [name, shape] : nn::decoder_parameter_shapes(config)) {
    core->param_index.push_back(position.at(name));
    link.targets.push_back(nn::decoder_tp_map(config, name, link.size, wire));
  }
  link.sources = affine::maps_from_json(link.shared->get_string("source_maps", options.timeout));
  if (link.sources.size() != link.targets.size())
    throw ConfigError("weight sync: the training job sends " + std::to_string(link.sources.size()) +
                      " parameters, the rollout model has " + std::to_string(link.targets.size()));
  impl_->core = core;
  actors::SinkWork work;
  work.receive = [core](bool listening) { return core->receive(listening); };
  work.record = [core](const WeightSyncStats* stats, std::exception_ptr error) { core->record(stats, error); };
  work.stop = core->stop;
  impl_->actor = actors::spawn_rollout_sink(std::move(work));
}

RolloutSink::~RolloutSink() {
  try {
    stop();
  } catch (...) {
  }
  caf::anon_send_exit(impl_->actor, caf::exit_reason::user_shutdown);
  caf::scoped_actor self{actors::actor_system()};
  self->wait_for(impl_->actor);
}

WeightSyncStats RolloutSink::receive() {
  if (impl_->listening) throw Error("RolloutSink::receive: the sink is listening (it receives every sync itself)");
  const auto& o = impl_->core->link->options;
  return actors::checked(actors::ask<actors::SyncReport>(impl_->actor, o.timeout * 4 + std::chrono::seconds(10),
                                                         "rollout-sink '" + o.session + "'", actors::sync_atom::value))
      .stats;
}

void RolloutSink::listen() {
  if (impl_->core->link->options.mode != SinkMode::double_buffered)
    throw ConfigError("RolloutSink::listen: only a double-buffered sink receives while generation runs (mode is in_place)");
  if (impl_->listening) return;
  impl_->listening = true;
  caf::anon_send(impl_->actor, actors::listen_atom::value);
}

void RolloutSink::stop() {
  if (!impl_->listening) return;
  *impl_->core->stop = true;
  const auto& o = impl_->core->link->options;
  actors::checked(actors::ask<actors::Done>(impl_->actor, o.timeout * 4 + std::chrono::seconds(10),
                                            "rollout-sink '" + o.session + "'", actors::stop_atom::value));
  impl_->listening = false;
  *impl_->core->stop = false;
}

WeightSyncStats RolloutSink::wait_for_version(uint64_t version, std::chrono::milliseconds timeout) {
  auto& c = *impl_->core;
  if (!impl_->listening) throw Error("RolloutSink::wait_for_version: the sink is not listening (call listen())");
  std::unique_lock<std::mutex> lock(c.mutex);
  const uint64_t failures = c.failures;
  if (!c.changed.wait_for(lock, timeout, [&] { return c.latest_version >= version || c.failures != failures; }))
    throw TimeoutError("RolloutSink::wait_for_version: version " + std::to_string(version) + " did not arrive within " +
                       std::to_string(timeout.count()) + " ms (latest " + std::to_string(c.latest_version) + ")");
  if (c.latest_version < version) std::rethrow_exception(c.last_error);
  return c.last_stats;
}

}  // namespace tessera
