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
// is collective over both jobs, each side publishes its model config and the training side its
// source maps; both sides compare the configs and refuse a mismatch with the same error, before
// any byte moves. Each sync is one RemoteExecutor batch (it agrees on the plans' digests on every
// process first), then verified: both ends hash the bytes of every (training rank, rollout rank)
// pair of every tensor in the same order (core/affine/segment_digest.h) and the rollout ranks
// compare; every rank of both jobs learns every verdict, so a mismatch (naming the tensor and both
// ranks) fails the sync on all of them alike. Only a verified sync publishes a new weight version;
// a failed one leaves the rollout engine refusing to generate until the next good sync.
// Dtypes: the wire carries the rollout's dtype; when the training weights differ (fp32 training,
// bf16 rollout: the common case) the sender casts each flat weight buffer with LibTorch's .to()
// into a copy it keeps (half the weights' bytes for bf16, reported as cast_mirror_bytes).
// This increment syncs in place (generation must not run during receive()) and the whole model
// each time; double buffering and delta syncs are the next increments.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tessera {

class Engine;
class RolloutEngine;
namespace nn {
struct DecoderConfig;
}

struct WeightSyncOptions {
  std::string train_job;    // TESSERA_JOB of each job
  std::string rollout_job;
  std::string session = "weights";  // several senders/sinks may coexist under other names
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  int64_t staging_bytes = int64_t{64} << 20;  // in flight per process per round
  // Which training rank sends a weight every rank holds (ZeRO 0-2): "lowest" sends everything
  // from rank 0, "balanced" spreads the bytes over the training ranks (for ranks with their own
  // cores and links; on 2 shared cores one sender measured faster: bench/sync, 1.3 s vs 2.3 s).
  // Both jobs must agree (part of the handshake).
  std::string replica_policy = "lowest";
  // Tests only (the sink): called on each received local tensor after the transfer and before
  // the hashes, to show that a corrupted byte is caught.
  std::function<void(const std::string& name, at::Tensor& local)> tamper_for_testing;
  // Tests only (the sender's rank 0): edits the source maps' JSON as published to the rollout job
  // (not the maps the sender plans with), to show that two sides planning differently are refused.
  std::function<void(std::string& source_maps_json)> tamper_published_maps_for_testing;
  // Tests only (the sender): called on every training rank just before each sync's transfer batch
  // with the sync's number (0, 1, ...), e.g. to kill a rank mid-sync.
  std::function<void(uint64_t sync)> before_transfer_for_testing;
};

struct WeightSyncStats {
  uint64_t version = 0;         // the rollout weight version this sync produced
  int64_t bytes_sent = 0;       // by this process (training) / received (rollout)
  int64_t puts = 0;
  double plan_ms = 0;           // building the plans (first sync only; 0 after)
  double sync_ms = 0;           // the transfer batch
  double verify_ms = 0;         // hashing both ends and agreeing on the verdict
  double cast_ms = 0;           // training side: casting into the rollout's dtype (0 when equal)
  int64_t cast_mirror_bytes = 0;  // training side: the cast copy kept for that (outside staging)
  double wire_to_useful = 0;    // rollout side
  int64_t staging_peak_bytes = 0;  // the transfer's staging buffer at its largest, this process
};

// For receivers that are not tessera's (vLLM- or SGLang-style engines): what the training engine's
// weights are, by Hugging Face name, dtype and full shape, from its storage maps (nothing is
// materialised), and each weight as a tensor, one at a time (at ZeRO 0-2 views of the rank's own
// flat buffer: no copy; call between steps and do not keep them past the next step).
struct WeightMetadata {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
};
std::vector<WeightMetadata> weight_metadata(const Engine& engine);
void export_weights(const Engine& engine, const std::function<void(const std::string& name, const at::Tensor& weight)>& f);

class WeightSender {
 public:
  // Collective over both jobs. `config` is the trained model's (DecoderLm's) config.
  WeightSender(Engine& engine, const nn::DecoderConfig& config, const WeightSyncOptions& options);
  ~WeightSender();
  WeightSyncStats sync();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

class RolloutSink {
 public:
  RolloutSink(RolloutEngine& rollout, const WeightSyncOptions& options);
  ~RolloutSink();
  WeightSyncStats receive();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
