// Internal to the weight sync (weight_sync.h): what the training job's WeightSender and the rollout
// job's sink share. One SyncLink per side and session: the store namespace "sync/<session>/", UCX
// endpoints to the other job, the plans (built once), and the phases every sync goes through on
// both sides, numbered by `syncs`:
//   start     the training side's rank 0 marks the sync begun (a listening sink waits for it)
//   packets   delta syncs only: every training rank's packet sizes per rollout rank, or "full"
//   update    one RemoteExecutor batch: the weights' plans, or the delta packets' plans
//   verify    both ends hash every (training rank, rollout rank) pair of every tensor; every
//             rollout rank's verdict is read by every rank of both jobs
// The training job's rank 0 hosts the store, so the training side leaves each exchange last.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "actors/rollout/weight_sync.h"
#include "core/affine/affine_map.h"
#include "core/affine/plan.h"
#include "transport/affine/remote_executor.h"

namespace tessera::transport {
class Store;
class UcxContext;
class UcxPeers;
}  // namespace tessera::transport

namespace tessera {

double ms_since(std::chrono::steady_clock::time_point t);
affine::DType affine_dtype(at::ScalarType t, const std::string& what);
// The node this process runs on, for the "local" replica policy: TESSERA_NODE_NAME, else the host name.
std::string node_name();

struct SyncLink {
  WeightSyncOptions options;
  bool training = false;
  int rank = 0, size = 0, peer_size = 0;
  std::shared_ptr<transport::Store> store;   // this link's own connection to the job's store
  std::shared_ptr<transport::Store> shared;  // "shared/sync/<session>/" through it
  std::shared_ptr<transport::UcxContext> context;  // shared: memory it allocated may outlive the link
  std::unique_ptr<transport::UcxPeers> peers;
  std::unique_ptr<transport::RemoteExecutor> executor;
  std::vector<affine::TensorMap> sources, targets;  // per parameter, decoder_parameter_shapes order
  std::vector<affine::Plan> plans;
  bool planned = false;
  uint64_t syncs = 0;        // completed sync attempts, the same count on both sides
  bool last_verified = false;  // the last attempt verified: a delta may build on it
  std::vector<std::string> train_nodes, rollout_nodes;  // node_name() of every rank of each job

  SyncLink(const WeightSyncOptions& o, bool is_training, int my_rank, int my_size);
  ~SyncLink();

  int train_size() const { return training ? size : peer_size; }
  int rollout_size() const { return training ? peer_size : size; }
  bool delta_now() const { return options.delta && last_verified; }

  // Both configs (and the sync's options both sides must share) compared through the store before
  // any UCX endpoint exists; a mismatch is refused with the same message on both sides.
  void agree_on_config(const std::string& config_json);
  void connect();  // UCX endpoints to the other job and the executor
  double plan_once();  // the time planning took on the first sync, 0 after

  // start: the training side marks it; a sink waits for it, until `timeout`, or, listening, until
  // `stop` (checked every 5 ms; returns false then).
  void mark_start();
  bool wait_for_start(std::chrono::milliseconds timeout, const std::atomic<bool>* stop);

  // packets: `mine` (training side) is this rank's packet bytes per rollout rank, empty for "full".
  // Returns every training rank's sizes ([training rank][rollout rank]); empty when any sends full.
  std::vector<std::vector<int64_t>> agree_on_packets(const std::vector<int64_t>& mine);
  // The packets' batch: one 1-D byte plan per (training rank, rollout rank) pair with bytes; the
  // plans live in `packet_plans` until the next call. Buffers are left for the caller.
  std::vector<transport::RemoteTransfer> packet_batch(const std::vector<std::vector<int64_t>>& sizes);
  std::vector<affine::Plan> packet_plans;
  std::vector<std::pair<int, int>> packet_pairs;  // per packet transfer: (training rank, rollout rank)

  // verify: digests published by the training side, compared by each rollout rank; every verdict
  // read by every rank. Returns the failures ("" = verified) and sets last_verified.
  // The source side's digests, per rollout rank the text publish_source_digests sets: pure reads of
  // the plans and the source buffers, so it may run on another thread while the transfer reads them.
  std::map<int, std::string> source_digests(const std::vector<transport::RemoteTransfer>& batch) const;
  void publish_source_digests(const std::map<int, std::string>& per_target);
  std::string verify_target_digests(const std::vector<transport::RemoteTransfer>& batch);
  std::string all_verdicts(const std::string& mine_if_rollout);

  // The weights' batch, without buffers.
  std::vector<transport::RemoteTransfer> batch_skeleton() const;
  std::string key(const std::string& what, const std::string& rest) const;

 private:
  void rollout_finished(const std::string& phase);
};

}  // namespace tessera
