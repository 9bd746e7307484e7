// WeightSender (weight_sync.h): the training side of a sync.
#include <torch/torch.h>

#include <future>
#include <map>

#include "actors/engine/engine.h"
#include "actors/rollout/sync_link.h"
#include "actors/rollout/weight_sync.h"
#include "core/affine/delta_packet.h"
#include "core/affine/serialize.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "core/nn/tensor_parallel.h"
#include "core/nn/tp_maps.h"
#include "transport/store.h"

namespace tessera {

struct WeightSender::Impl {
  const Engine* engine = nullptr;  // asked only whether its states are offloaded
  std::unique_ptr<SyncLink> link;
  EngineStorage storage;
  std::vector<std::string> buffer_of;  // per parameter, its key in storage.buffers
  bool lent_weights = false;           // parameters on NVMe: storage.buffers' weights asked again each sync
  // When the rollout's dtype differs: a copy of each flat weight buffer in that dtype, cast by
  // LibTorch's .to() at every sync (so the bits are exactly that cast's), and sent instead.
  std::map<std::string, torch::Tensor> cast_mirrors;
  // Delta syncs: the last synced bits of every buffer this rank sends from, and the packets.
  std::map<std::string, torch::Tensor> last_synced;
  std::vector<std::vector<uint8_t>> packets;  // per rollout rank

  torch::Tensor& wire_buffer(size_t i) {
    const auto& key = buffer_of[i];
    auto mirror = cast_mirrors.find(key);
    return mirror != cast_mirrors.end() ? mirror->second : storage.buffers.at(key);
  }
  // Builds this rank's packets; false when they would pass the staging budget (send full).
  bool pack(WeightSyncStats& stats);
  void remember_synced();
};

WeightSender::WeightSender(Engine& engine, const nn::DecoderConfig& config, const WeightSyncOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->engine = &engine;
  // Parameters on NVMe are lent by storage_maps() only until the next gather: each sync asks again.
  impl_->lent_weights = engine.config().zero_optimization.offload_param.device.value == config::OffloadDevice::nvme;
  impl_->link = std::make_unique<SyncLink>(options, true, engine.rank(), engine.world_size());
  auto& link = *impl_->link;
  impl_->storage = engine.storage_maps();
  std::map<std::string, const StoredTensorMap*> weights;
  for (const auto& m : impl_->storage.maps)
    if (m.kind == "param") weights[m.map.name] = &m;
  for (const auto& [name, shape] : nn::decoder_parameter_shapes(config)) {
    auto it = weights.find(name);
    if (it == weights.end())
      throw ConfigError("weight sync: the training engine has no parameter '" + name + "' of the " + config.model_type() +
                        " config");
    affine_dtype(impl_->storage.buffers.at(it->second->buffer).scalar_type(), "training parameter '" + name + "'");
    link.sources.push_back(it->second->map);
    impl_->buffer_of.push_back(it->second->buffer);
  }
  if (weights.size() != link.sources.size())
    throw ConfigError("weight sync: the training engine holds " + std::to_string(weights.size()) +
                      " parameters, the config names " + std::to_string(link.sources.size()));
  link.agree_on_config(nn::decoder_config_json(config));
  // The rollout's dtype is the wire's (published before its acknowledgement, so present now).
  const auto wire = affine::parse_dtype(link.shared->get_string("rollout_dtype", options.timeout));
  for (size_t i = 0; i < link.sources.size(); ++i) {
    const auto& key = impl_->buffer_of[i];
    const auto& flat = impl_->storage.buffers.at(key);
    if (affine_dtype(flat.scalar_type(), key) != wire && !impl_->cast_mirrors.count(key))
      impl_->cast_mirrors[key] = torch::empty({flat.numel()}, flat.options().dtype(scalar_type(wire)));
    link.sources[i].dtype = wire;  // same element offsets, in the mirror when cast
  }
  link.connect();
  if (link.rank == 0) {
    auto published = affine::maps_to_json(link.sources);
    if (options.tamper_published_maps_for_testing) options.tamper_published_maps_for_testing(published);
    link.shared->set("source_maps", published);
  }
  link.sources = affine::maps_from_json(affine::maps_to_json(link.sources));  // exactly what the sink reads
  for (const auto& [name, shape] : nn::decoder_parameter_shapes(config))
    link.targets.push_back(nn::decoder_tp_map(config, name, link.peer_size, wire));
}

WeightSender::~WeightSender() = default;

bool WeightSender::Impl::pack(WeightSyncStats& stats) {
  auto& l = *link;
  packets.assign(size_t(l.rollout_size()), {});
  int64_t total = 0;
  for (size_t i = 0; i < l.plans.size(); ++i) {
    auto& current = wire_buffer(i);
    auto base = last_synced.find(buffer_of[i]);
    const affine::LocalBuffer now{current.data_ptr(), current.numel(), l.plans[i].dtype};
    for (int t = 0; t < l.rollout_size(); ++t) {
      affine::DeltaPacketStats s;
      if (base == last_synced.end()) {  // this rank sends nothing of this tensor
        continue;
      }
      const affine::LocalBuffer before{base->second.data_ptr(), base->second.numel(), l.plans[i].dtype};
      auto& packet = packets[size_t(t)];
      // Every packet together stays within the staging budget, while they are built too.
      const bool fits = affine::append_delta(l.plans[i], l.rank, t, now, before, packet, s,
                                             int64_t(packet.size()) + l.options.staging_bytes - total);
      stats.changed_elements += s.changed;
      stats.full_bytes += s.elements * affine::element_size(l.plans[i].dtype);
      total += s.bytes;
      if (!fits) {
        packets.assign(packets.size(), {});  // the full sync follows: free them now
        return false;
      }
    }
  }
  return true;
}

// After any sync attempt the base is what was just sent (a failed one is followed by a full sync).
void WeightSender::Impl::remember_synced() {
  if (!link->options.delta) return;
  if (last_synced.empty()) {
    // The buffers this rank sends from: those with a segment sourced here.
    for (size_t i = 0; i < link->plans.size(); ++i)
      for (const auto& s : link->plans[i].segments)
        if (s.source_rank == link->rank && !last_synced.count(buffer_of[i])) {
          last_synced[buffer_of[i]] = wire_buffer(i).clone();
          break;
        }
    return;
  }
  for (auto& [key, copy] : last_synced) {
    auto mirror = cast_mirrors.find(key);
    copy.copy_(mirror != cast_mirrors.end() ? mirror->second : storage.buffers.at(key));
  }
}

WeightSyncStats WeightSender::sync() {
  if (impl_->engine->states_offloaded())
    throw Error("weight sync: the training engine's states are offloaded (offload_states); call reload_states() "
                "first (sync before offloading, as the GRPO job does)");
  auto& link = *impl_->link;
  if (impl_->lent_weights) {  // the same maps and keys; this step's values, paged in from the swap
    auto fresh = impl_->engine->weight_storage_maps();
    for (const auto& key : impl_->buffer_of) impl_->storage.buffers.at(key) = fresh.buffers.at(key);
  }
  WeightSyncStats stats;
  stats.plan_ms = link.plan_once();
  link.mark_start();
  const auto c = std::chrono::steady_clock::now();
  for (auto& [key, mirror] : impl_->cast_mirrors) {
    mirror.copy_(impl_->storage.buffers.at(key));
    stats.cast_mirror_bytes += mirror.numel() * int64_t(mirror.element_size());
  }
  stats.cast_ms = ms_since(c);
  auto batch = link.batch_skeleton();
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& buffer = impl_->wire_buffer(i);
    batch[i].source_buffers[link.rank] = {buffer.data_ptr(), buffer.numel(), link.sources[i].dtype};
  }
  // Delta: this rank's packets, then everyone's sizes; any rank over budget makes it a full sync.
  std::vector<std::vector<int64_t>> sizes;
  if (link.delta_now()) {
    const auto p = std::chrono::steady_clock::now();
    std::vector<int64_t> mine;
    if (impl_->pack(stats))
      for (const auto& packet : impl_->packets) mine.push_back(int64_t(packet.size()));
    stats.pack_ms = ms_since(p);
    sizes = link.agree_on_packets(mine);
  }
  for (const auto& [key, copy] : impl_->last_synced) stats.delta_base_bytes += copy.numel() * int64_t(copy.element_size());
  if (link.options.before_transfer_for_testing) link.options.before_transfer_for_testing(link.syncs);
  const auto t = std::chrono::steady_clock::now();
  // The source digests are hashed on another thread while the transfer runs: both only read the
  // source buffers (unchanged until the sync ends), and on one machine the targets' ranks wait
  // idle meanwhile (bench/sync: the verification after a 327 MB transfer 22-33 ms -> the
  // rollout side's hashing only). A delta is verified over the full buffers too.
  auto digests = std::async(std::launch::async, [&link, &batch] { return link.source_digests(batch); });
  transport::RemoteTransferStats s;
  if (!sizes.empty()) {
    auto packets = link.packet_batch(sizes);
    for (size_t i = 0; i < packets.size(); ++i)
      if (link.packet_pairs[i].first == link.rank) {
        auto& packet = impl_->packets[size_t(link.packet_pairs[i].second)];
        packets[i].source_buffers[0] = {packet.data(), int64_t(packet.size()), affine::DType::u8};
      }
    s = link.executor->execute(packets);
    stats.delta = true;
  } else {
    s = link.executor->execute(batch);
  }
  stats.sync_ms = ms_since(t);
  stats.bytes_sent = s.bytes_sent, stats.puts = s.puts, stats.staging_peak_bytes = s.staging_peak_bytes;
  stats.bytes_mapped = s.bytes_mapped;
  if (link.options.after_transfer_for_testing) link.options.after_transfer_for_testing(link.syncs);
  const auto v = std::chrono::steady_clock::now();
  link.publish_source_digests(digests.get());
  const auto failures = link.all_verdicts("");
  stats.verify_ms = ms_since(v);
  ++link.syncs;
  impl_->remember_synced();
  if (!failures.empty())
    throw TransportError("weight sync '" + link.options.session + "': the rollout job did not verify sync " +
                         std::to_string(link.syncs) + ": " + failures);
  return stats;
}

}  // namespace tessera
