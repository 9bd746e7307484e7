// Training -> rollout weight sync: the training job's weights, read straight from the ZeRO
// engine's flat buffers, move over UCX into a RolloutEngine's tensor-parallel shards, planned once
// from affine maps (Engine::storage_maps() as sources, core/nn/tp_maps.h as targets) and replayed
// at every sync. No rank ever materialises a whole parameter.
//
//   training job, every rank:   WeightSender sender(*engine, config, {.train_job = "train", .rollout_job = "rollout"});
//                               ... train ...; sender.sync();
//   rollout job, every rank:    RolloutSink sink(*rollout, {.train_job = "train", .rollout_job = "rollout"});
//                               sink.receive();   // blocks until the training side syncs; version + 1
//
// The two jobs meet in one store (the rollout job joins the training job's store server with the
// same secret, as tests/transport/two_jobs.py starts them) and in UCX. At construction, which
// is collective over both jobs, each side publishes its model config and the sync options both
// must share; both sides compare them and refuse a mismatch with the same error, before any byte
// moves. A sync goes start -> update -> verify -> publish (vLLM's weight-transfer phases): one
// RemoteExecutor batch (it agrees on the plans' digests on every process first), then both ends
// hash the bytes of every (training rank, rollout rank) pair of every tensor in the same order
// (core/affine/segment_digest.h) and the rollout ranks compare; every rank of both jobs learns
// every verdict, so a mismatch (naming the tensor and both ranks) fails the sync on all of them.
// Only a verified sync publishes a new weight version.
//
// Modes (SinkMode):
//   in_place        the sync writes the live weights: generation must not run during receive(),
//                   and a failed sync leaves the engine refusing to generate until a good one.
//   double_buffered the sync writes the engine's standby copy (one more copy of the rollout
//                   weights) while generation goes on; a verified copy becomes live at the next
//                   generate() on every TP rank (a swap of storages); a failed one is dropped and
//                   the previous version keeps serving. listen() receives every sync on the sink
//                   actor's own thread; wait_for_version() waits for one.
// Delta syncs (delta = true): after a verified sync, only the elements whose bits changed since
// then travel (core/affine/delta_packet.h), and the result is verified exactly as a full sync's
// (the hashes cover every element, not only the changed ones). The training side keeps a copy of
// the last synced bits of the buffers it sends (reported as delta_base_bytes); a delta larger than
// the staging budget is sent as a full sync instead.
// Configuration: a tessera config file's [tessera.rollout] section (core/config/config.h's
// RolloutConfig) sets three of the options through weight_sync_options(config) below; the others are
// the program's. The defaults of those three are RolloutConfig's, written there once.
// Dtypes: the wire carries the rollout's dtype; when the training weights differ (fp32 training,
// bf16 rollout: the common case) the sender casts each flat weight buffer with LibTorch's .to()
// into a copy it keeps (half the weights' bytes for bf16, reported as cast_mirror_bytes).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/affine/replica_policy.h"
#include "core/config/config.h"

namespace tessera {

class Engine;
class RolloutEngine;
namespace nn {
struct DecoderConfig;
}

enum class SinkMode { in_place, double_buffered };

struct WeightSyncOptions {
  std::string train_job;    // TESSERA_JOB of each job
  std::string rollout_job;
  std::string session = "weights";  // several senders/sinks may coexist under other names
  // From [tessera.rollout] (weight_sync_options): timeout <- sync_timeout_ms, staging_bytes <-
  // staging_budget_bytes, replica_policy <- replica_policy; defaults: RolloutConfig's.
  std::chrono::milliseconds timeout{config::RolloutConfig{}.sync_timeout_ms};  // each wait of a sync
  int64_t staging_bytes = config::RolloutConfig{}.staging_budget_bytes;  // in flight per process per round
  // A training rank putting more than this per sync into a rollout's memory mapped on its machine
  // writes it with streaming stores (transport/affine/streaming_copy.h); 0: always.
  int64_t streaming_copy_bytes = int64_t{32} << 20;
  // Which training rank sends a weight every rank holds (ZeRO 0-2; core/affine/replica_policy.h):
  // lowest sends everything from rank 0, balanced spreads the bytes over the training ranks (for
  // ranks with their own cores and links; the default and why: affine::kDefaultReplicaPolicy),
  // local reads from a holder on the rollout rank's node when there is one (nodes named by
  // TESSERA_NODE_NAME, else the host name), the least loaded of them. callback is refused (it needs
  // code on both jobs). Both jobs must agree (part of the handshake, by name).
  affine::ReplicaPolicyKind replica_policy = config::RolloutConfig{}.replica_policy;
  bool delta = false;  // both jobs must agree (part of the handshake)
  SinkMode mode = SinkMode::in_place;  // the sink's; the sender ignores it
  // Tests only (the sink): called on each received local tensor after the transfer and before
  // the hashes, to show that a corrupted byte is caught.
  std::function<void(const std::string& name, at::Tensor& local)> tamper_for_testing;
  // Tests only (the sender's rank 0): edits the source maps' JSON as published to the rollout job
  // (not the maps the sender plans with), to show that two sides planning differently are refused.
  std::function<void(std::string& source_maps_json)> tamper_published_maps_for_testing;
  // Tests only (the sender): called on every training rank just before each sync's transfer batch
  // with the sync's number (0, 1, ...), e.g. to kill a rank mid-sync.
  std::function<void(uint64_t sync)> before_transfer_for_testing;
  // Tests only (the sender): the same, after the transfer batch (every byte put) and before the hashes.
  std::function<void(uint64_t sync)> after_transfer_for_testing;
};

// `options` with the fields [tessera.rollout] sets taken from `config` (validated by its loading):
// replica_policy, staging_bytes (staging_budget_bytes) and timeout (sync_timeout_ms). A file
// without the section gives RolloutConfig's defaults, the same as a default WeightSyncOptions.
// max_rounds_in_flight is not read (the sync has no such setting yet).
WeightSyncOptions weight_sync_options(const config::Config& config, WeightSyncOptions options = {});

struct WeightSyncStats {
  uint64_t version = 0;         // the rollout weight version this sync produced
  int64_t bytes_sent = 0;       // by this process (training) / received (rollout)
  int64_t bytes_mapped = 0;     // training side: of bytes_sent, copied straight into rollout memory mapped here
  int64_t puts = 0;
  double plan_ms = 0;           // building the plans (first sync only; 0 after)
  double sync_ms = 0;           // the transfer batch
  double verify_ms = 0;         // hashing both ends and agreeing on the verdict
  double cast_ms = 0;           // training side: casting into the rollout's dtype (0 when equal)
  int64_t cast_mirror_bytes = 0;  // training side: the cast copy kept for that (outside staging)
  double wire_to_useful = 0;    // rollout side
  int64_t staging_peak_bytes = 0;  // the transfer's staging buffer at its largest, this process
  // Rollout side: how long generation could not run because of this sync (in place: from the
  // first byte written to the publish; double-buffered: 0 here, the swap is
  // RolloutEngine::last_swap_ms()).
  double pause_ms = 0;
  // Delta syncs.
  bool delta = false;              // this sync sent deltas (false: the first, after a failure, or over budget)
  double pack_ms = 0;              // training side: building the packets / rollout side: applying them
  int64_t changed_elements = 0;    // training side: elements whose bits changed, summed over its packets
  int64_t full_bytes = 0;          // training side: what a full sync would have sent from this process
  int64_t delta_base_bytes = 0;    // training side: the copy of the last synced bits it keeps
};

// For receivers that are not tessera's (vLLM- or SGLang-style engines): what the training engine's
// weights are, by Hugging Face name, dtype and full shape, from its storage maps (nothing is
// materialised), and each weight as a tensor, one at a time (at ZeRO 0-2 views of the rank's own
// flat buffer: no copy; call between steps and do not keep them past the next step; at ZeRO-3
// one unit gathered at a time, collective: every rank calls it, and a weight is valid only inside f).
struct WeightMetadata {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
std::vector<WeightMetadata> weight_metadata(const Engine& engine);
void export_weights(const Engine& engine, const std::function<void(const std::string& name, const at::Tensor& weight)>& f);

class WeightSender {
 public:
  // Collective over both jobs. `config` is the trained model's (DecoderLm's) config. `engine` must
  // outlive the sender; sync() refuses while its states are offloaded (Engine::offload_states).
  WeightSender(Engine& engine, const nn::DecoderConfig& config, const WeightSyncOptions& options);
  ~WeightSender();
  WeightSyncStats sync();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The rollout-sink: an actor (its own thread) that owns the sync's UCX registration of the
// rollout's weight storage and writes the versions into the engine.
class RolloutSink {
 public:
  RolloutSink(RolloutEngine& rollout, const WeightSyncOptions& options);
  ~RolloutSink();  // stops listening (waits for a sync under way)
  // One sync, blocking (until the training side syncs, within the timeout). In place: the live
  // weights; double-buffered: into the standby copy, live at the next generate().
  WeightSyncStats receive();
  // Double-buffered only: receive every sync as it comes, on the actor's thread, until stop().
  void listen();
  void stop();
  // Listening: waits until sync `version` is staged or live (throws the error of a sync that failed
  // meanwhile, or TimeoutError).
  WeightSyncStats wait_for_version(uint64_t version, std::chrono::milliseconds timeout);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
