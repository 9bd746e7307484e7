#include "actors/rollout/weight_sync.h"

#include <torch/torch.h>

#include <chrono>
#include <map>
#include <sstream>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "core/affine/planner.h"
#include "core/affine/segment_digest.h"
#include "core/affine/serialize.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "core/nn/tensor_parallel.h"
#include "core/nn/tp_maps.h"
#include "transport/affine/remote_executor.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_peers.h"

namespace tessera {
namespace {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

// What both sides share: UCX to the other job, the store namespace of this session, the plans.
struct SyncLink {
  WeightSyncOptions options;
  bool training = false;
  int rank = 0, size = 0, peer_size = 0;
  std::shared_ptr<transport::Store> shared;  // "shared/sync/<session>/"
  std::unique_ptr<transport::UcxContext> context;
  std::unique_ptr<transport::UcxPeers> peers;
  std::unique_ptr<transport::RemoteExecutor> executor;
  std::vector<affine::TensorMap> sources, targets;  // per parameter, decoder_parameter_shapes order
  std::vector<affine::Plan> plans;
  bool planned = false;
  uint64_t syncs = 0;  // completed sync attempts, the same count on both sides

  SyncLink(const WeightSyncOptions& o, bool is_training, int my_rank, int my_size) : options(o), training(is_training),
      rank(my_rank), size(my_size) {
    if (o.replica_policy != "balanced" && o.replica_policy != "lowest")
      throw ConfigError("weight sync: replica_policy '" + o.replica_policy + "' is not one of balanced, lowest");
    if (o.train_job.empty() || o.rollout_job.empty() || o.train_job == o.rollout_job)
      throw ConfigError("weight sync: train_job and rollout_job must name the two jobs (got '" + o.train_job + "', '" +
                        o.rollout_job + "')");
    shared = actors::job_store()->shared("sync/" + o.session);
  }

  // After agree_on_config: UCX endpoints to the other job and the executor.
  void connect() {
    context = std::make_unique<transport::UcxContext>(transport::UcxContextOptions{});
    peers = std::make_unique<transport::UcxPeers>(*context, actors::job_store(),
                                                  training ? options.train_job : options.rollout_job, rank, size,
                                                  "sync/" + options.session);
    peer_size = peers->connect(training ? options.rollout_job : options.train_job);
    transport::RemoteExecutorOptions eo;
    eo.staging_bytes = options.staging_bytes;
    eo.timeout = options.timeout;
    executor = std::make_unique<transport::RemoteExecutor>(*peers, "sync/" + options.session, eo);
  }

  // Both configs, compared on both sides through the store before any UCX endpoint exists: each
  // side publishes its config and size, reads the other's, acknowledges, and waits for every rank
  // of the other side to have acknowledged; only then does it refuse a mismatch (with the same
  // message on both sides) or go on. So no side leaves while the other still needs it.
  void agree_on_config(const nn::DecoderConfig& mine) {
    const std::string role = training ? "train" : "rollout", peer_role = training ? "rollout" : "train";
    const std::string own = nn::decoder_config_json(mine) + "replica_policy: " + options.replica_policy + "\n";
    if (rank == 0) {
      shared->set(role + "_config", own);
      shared->set(role + "_size", std::to_string(size));
    }
    std::string theirs;
    try {
      theirs = shared->get_string(peer_role + "_config", options.timeout);
      peer_size = std::stoi(shared->get_string(peer_role + "_size", options.timeout));
      shared->set("ack/" + role + "/" + std::to_string(rank), "1");
      std::vector<std::string> acks;
      for (int r = 0; r < peer_size; ++r) acks.push_back("ack/" + peer_role + "/" + std::to_string(r));
      shared->wait(acks, options.timeout);
      rollout_finished("agreed/");
    } catch (const TimeoutError&) {
      throw TimeoutError("weight sync '" + options.session + "': the " + (training ? "rollout" : "training") +
                         " job did not meet within " + std::to_string(options.timeout.count()) +
                         " ms (is it up, with the same store, secret and session?)");
    }
    if (theirs != own) {
      const auto& train = training ? own : theirs;
      const auto& rollout = training ? theirs : own;
      throw ConfigError("weight sync '" + options.session + "': the two jobs' models differ; training job '" +
                        options.train_job + "' has " + train + "rollout job '" + options.rollout_job + "' has " +
                        rollout);
    }
  }

  // Plans every tensor on the first sync; the time it took then, 0 after.
  double plan_once() {
    if (planned) return 0;
    const auto t = std::chrono::steady_clock::now();
    plans.clear();
    affine::PlanOptions po;
    po.policy = affine::parse_replica_policy(options.replica_policy);
    for (size_t i = 0; i < targets.size(); ++i) plans.push_back(affine::plan(targets[i], sources[i], po));
    planned = true;
    return ms_since(t);
  }

  // The training side publishes, per rollout rank, the digests of what it sent there; each rollout
  // rank compares them with what it holds and publishes its verdict ("" = verified); every rank of
  // both jobs then reads every verdict and throws the same error when one failed.
  void publish_source_digests(const std::vector<transport::RemoteTransfer>& batch) {
    std::map<int, std::string> per_target;  // "<plan>:<hex> ..." per rollout rank
    for (size_t i = 0; i < batch.size(); ++i)
      for (const auto& [pair, digest] : affine::segment_digests(plans[i], batch[i].source_buffers, true))
        per_target[pair.second] += std::to_string(i) + ":" + affine::hex_digest(digest) + " ";
    const int rollout_size = peer_size;
    for (int t = 0; t < rollout_size; ++t)
      shared->set(key("digests", std::to_string(rank) + "/" + std::to_string(t)), per_target[t]);
  }

  std::string verify_target_digests(const std::vector<transport::RemoteTransfer>& batch) {
    std::map<std::pair<size_t, int>, uint64_t> mine;  // (plan, training rank) -> digest
    for (size_t i = 0; i < batch.size(); ++i)
      for (const auto& [pair, digest] : affine::segment_digests(plans[i], batch[i].target_buffers, false))
        mine[{i, pair.first}] = digest;
    std::string problems;
    for (int s = 0; s < peer_size; ++s) {
      std::map<size_t, std::string> sent;
      std::istringstream in(shared->get_string(key("digests", std::to_string(s) + "/" + std::to_string(rank)), options.timeout));
      for (std::string item; in >> item;) sent[std::stoul(item.substr(0, item.find(':')))] = item.substr(item.find(':') + 1);
      for (const auto& [plan_and_rank, digest] : mine) {
        if (plan_and_rank.second != s) continue;
        auto it = sent.find(plan_and_rank.first);
        if (it == sent.end() || it->second != affine::hex_digest(digest))
          problems += "tensor '" + plans[plan_and_rank.first].name + "' from training rank " + std::to_string(s) +
                      " to rollout rank " + std::to_string(rank) + ": digest " + affine::hex_digest(digest) +
                      " received, " + (it == sent.end() ? std::string("none") : it->second) + " sent; ";
      }
    }
    return problems;
  }

  // Every rollout rank's verdict, read by every rank of both jobs; the training side returns only
  // once every rollout rank has read them all (rollout_finished).
  std::string all_verdicts(const std::string& mine_if_rollout) {
    if (!training) shared->set(key("verdict", std::to_string(rank)), mine_if_rollout.empty() ? "ok" : mine_if_rollout);
    const int rollout_size = training ? peer_size : size;
    std::string failures;
    for (int r = 0; r < rollout_size; ++r) {
      const auto v = shared->get_string(key("verdict", std::to_string(r)), options.timeout);
      if (v != "ok") failures += v;
    }
    rollout_finished(key("verdicts_read", ""));
    return failures;
  }

  // The training job's rank 0 hosts the store, so the training side leaves a store exchange last:
  // each rollout rank marks `phase` done (its last store call in it) and the training ranks wait
  // for all of them. Otherwise a job that left right after would cut off a rollout rank still
  // waiting for a reply.
  void rollout_finished(const std::string& phase) {
    const int rollout_size = training ? peer_size : size;
    if (!training) return shared->set(phase + std::to_string(rank), "1");
    std::vector<std::string> done;
    for (int r = 0; r < rollout_size; ++r) done.push_back(phase + std::to_string(r));
    shared->wait(done, options.timeout);
  }

  std::string key(const std::string& what, const std::string& rest) const {
    return what + "/" + std::to_string(syncs) + "/" + rest;
  }

  std::vector<transport::RemoteTransfer> batch_skeleton() const {
    std::vector<transport::RemoteTransfer> batch(plans.size());
    const int train_size = training ? size : peer_size, rollout_size = training ? peer_size : size;
    for (size_t i = 0; i < plans.size(); ++i) {
      batch[i].plan = &plans[i];
      for (int r = 0; r < train_size; ++r) batch[i].source_processes.push_back({options.train_job, r});
      for (int r = 0; r < rollout_size; ++r) batch[i].target_processes.push_back({options.rollout_job, r});
    }
    return batch;
  }
};

affine::DType affine_dtype(at::ScalarType t, const std::string& what) {
  if (t == at::kFloat) return affine::DType::f32;
  if (t == at::kBFloat16) return affine::DType::bf16;
  if (t == at::kHalf) return affine::DType::f16;
  throw ConfigError("weight sync: " + what + " is " + std::string(c10::toString(t)) + "; weights sync as fp32, bf16 or fp16");
}

at::ScalarType scalar_type(affine::DType t) {
  return t == affine::DType::bf16 ? at::kBFloat16 : t == affine::DType::f16 ? at::kHalf : at::kFloat;
}

}  // namespace

std::vector<WeightMetadata> weight_metadata(const Engine& engine) {
  const auto storage = engine.storage_maps();
  std::vector<WeightMetadata> out;
  for (const auto& m : storage.maps)
    if (m.kind == "param")
      out.push_back({m.map.name, storage.buffers.at(m.buffer).scalar_type(), m.map.shape.to_vector()});
  return out;
}

void export_weights(const Engine& engine, const std::function<void(const std::string&, const at::Tensor&)>& f) {
  const auto storage = engine.storage_maps();
  for (const auto& m : storage.maps) {
    if (m.kind != "param") continue;
    const auto& pieces = m.map.ranks.at(engine.rank()).pieces;
    const auto& flat = storage.buffers.at(m.buffer);
    if (pieces.size() != 1 || !pieces[0].box.contains(affine::Box::whole(m.map.shape)))
      throw Error("export_weights: '" + m.map.name + "' is not whole on rank " + std::to_string(engine.rank()) +
                  " (ZeRO-3 gathers come with ZeRO-3)");
    const auto& p = pieces[0];
    if (p.strides != affine::row_major_strides(m.map.shape))
      throw Error("export_weights: '" + m.map.name + "' is not stored row-major");
    f(m.map.name, flat.narrow(0, p.offset, m.map.numel()).view(m.map.shape.to_vector()));
  }
}

struct WeightSender::Impl {
  std::unique_ptr<SyncLink> link;
  EngineStorage storage;
  std::vector<std::string> buffer_of;  // per parameter, its key in storage.buffers
  // When the rollout's dtype differs: a copy of each flat weight buffer in that dtype, cast by
  // LibTorch's .to() at every sync (so the bits are exactly that cast's), and sent instead.
  std::map<std::string, torch::Tensor> cast_mirrors;
};

WeightSender::WeightSender(Engine& engine, const nn::DecoderConfig& config, const WeightSyncOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->link = std::make_unique<SyncLink>(options, true, engine.rank(), engine.world_size());
  auto& link = *impl_->link;
  impl_->storage = engine.storage_maps();
  std::map<std::string, const StoredTensorMap*> weights;
  for (const auto& m : impl_->storage.maps)
    if (m.kind == "param") weights[m.map.name] = &m;
  for (const auto& [name, shape] : nn::decoder_parameter_shapes(config)) {
    auto it = weights.find(name);
    if (it == weights.end())
      throw ConfigError("weight sync: the training engine has no parameter '" + name + "' of the " +
                        config.model_type() + " config");
    affine_dtype(impl_->storage.buffers.at(it->second->buffer).scalar_type(), "training parameter '" + name + "'");
    link.sources.push_back(it->second->map);
    impl_->buffer_of.push_back(it->second->buffer);
  }
  if (weights.size() != link.sources.size())
    throw ConfigError("weight sync: the training engine holds " + std::to_string(weights.size()) +
                      " parameters, the config names " + std::to_string(link.sources.size()));
  link.agree_on_config(config);
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

WeightSyncStats WeightSender::sync() {
  auto& link = *impl_->link;
  WeightSyncStats stats;
  stats.plan_ms = link.plan_once();
  const auto c = std::chrono::steady_clock::now();
  for (auto& [key, mirror] : impl_->cast_mirrors) {
    mirror.copy_(impl_->storage.buffers.at(key));
    stats.cast_mirror_bytes += mirror.numel() * int64_t(mirror.element_size());
  }
  stats.cast_ms = ms_since(c);
  auto batch = link.batch_skeleton();
  for (size_t i = 0; i < batch.size(); ++i) {
    const auto& key = impl_->buffer_of[i];
    auto mirror = impl_->cast_mirrors.find(key);
    auto& buffer = mirror != impl_->cast_mirrors.end() ? mirror->second : impl_->storage.buffers.at(key);
    batch[i].source_buffers[link.rank] = {buffer.data_ptr(), buffer.numel(), link.sources[i].dtype};
  }
  if (link.options.before_transfer_for_testing) link.options.before_transfer_for_testing(link.syncs);
  const auto t = std::chrono::steady_clock::now();
  const auto s = link.executor->execute(batch);
  stats.sync_ms = ms_since(t);
  stats.bytes_sent = s.bytes_sent, stats.puts = s.puts, stats.staging_peak_bytes = s.staging_peak_bytes;
  const auto v = std::chrono::steady_clock::now();
  link.publish_source_digests(batch);
  const auto failures = link.all_verdicts("");
  stats.verify_ms = ms_since(v);
  ++link.syncs;
  if (!failures.empty())
    throw TransportError("weight sync '" + link.options.session + "': the rollout job did not verify sync " +
                         std::to_string(link.syncs) + ": " + failures);
  return stats;
}

struct RolloutSink::Impl {
  std::unique_ptr<SyncLink> link;
  RolloutEngine* rollout = nullptr;
  std::vector<torch::Tensor> params;  // per parameter, this TP rank's local tensor
};

RolloutSink::RolloutSink(RolloutEngine& rollout, const WeightSyncOptions& options) : impl_(std::make_unique<Impl>()) {
  impl_->rollout = &rollout;
  impl_->link = std::make_unique<SyncLink>(options, false, rollout.tp_rank(), rollout.tp_size());
  auto& link = *impl_->link;
  const auto& config = rollout.config();
  const auto wire = affine_dtype(rollout.dtype(), "the rollout engine's dtype");
  if (link.rank == 0) link.shared->set("rollout_dtype", affine::dtype_name(wire));
  link.agree_on_config(config);
  link.connect();
  auto named = rollout.model().module()->named_parameters();
  for (const auto& [name, shape] : nn::decoder_parameter_shapes(config)) {
    auto p = named[name];
    impl_->params.push_back(p);
    link.targets.push_back(nn::decoder_tp_map(config, name, link.size, wire));
  }
  link.sources = affine::maps_from_json(link.shared->get_string("source_maps", options.timeout));
  if (link.sources.size() != link.targets.size())
    throw ConfigError("weight sync: the training job sends " + std::to_string(link.sources.size()) +
                      " parameters, the rollout model has " + std::to_string(link.targets.size()));
}

RolloutSink::~RolloutSink() = default;

WeightSyncStats RolloutSink::receive() {
  auto& link = *impl_->link;
  WeightSyncStats stats;
  stats.plan_ms = link.plan_once();
  auto batch = link.batch_skeleton();
  for (size_t i = 0; i < batch.size(); ++i) {
    auto& p = impl_->params[i];
    batch[i].target_buffers[link.rank] = {p.data_ptr(), p.numel(), link.targets[i].dtype};
  }
  impl_->rollout->mark_weights_torn();  // in place: from the first byte until verified
  const auto t = std::chrono::steady_clock::now();
  const auto s = link.executor->execute(batch);
  stats.sync_ms = ms_since(t);
  stats.bytes_sent = s.bytes_received, stats.puts = s.puts, stats.wire_to_useful = s.wire_to_useful;
  stats.staging_peak_bytes = s.staging_peak_bytes;
  if (link.options.tamper_for_testing)
    for (size_t i = 0; i < impl_->params.size(); ++i) link.options.tamper_for_testing(link.plans[i].name, impl_->params[i]);
  const auto v = std::chrono::steady_clock::now();
  const auto failures = link.all_verdicts(link.verify_target_digests(batch));
  stats.verify_ms = ms_since(v);
  ++link.syncs;
  if (!failures.empty())
    throw TransportError("weight sync '" + link.options.session + "': sync " + std::to_string(link.syncs) +
                         " failed verification, generation paused until a good sync: " + failures);
  stats.version = impl_->rollout->publish_synced_weights();
  return stats;
}

}  // namespace tessera
