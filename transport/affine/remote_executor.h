// The RemoteExecutor runs a batch of affine plans whose source and target buffers live in
// different processes: the ranks of a training job and of a rollout job, or other ranks of the
// same job. It is the remote half of core/affine's local executor.
//
// Cross-process contract (every process named by any transfer calls `execute` with the same batch
// description, each passing only the buffers it holds; processes not named return at once):
//   1. Validate locally: every plan rank is placed on a process; every buffer this process must
//      provide is there, with the plan's dtype, and every segment lies inside it; no byte of this
//      process's targets is written twice in the batch (two transfers into aliasing buffers
//      included) and no source byte of this process is also a target byte.
//   2. Agree before any byte moves: each process publishes (digest of the batch: plan digests,
//      input digests, placements; reject flag; reason) in the store, and reads everyone's. One
//      reject or one differing digest makes EVERY process throw the same
//      affine::TransferRefusedError (built from the same votes), with no byte moved; for differing
//      digests every process then publishes its per-tensor digests, and the error names the first
//      tensor planned differently. Unanimous votes are then committed through one atomic counter
//      of the epoch: a process that read them adds 1 and moves bytes only while no process has
//      withdrawn; a process that could not read them (a peer died, the votes timed out) adds
//      kWithdraw. The store orders the adds, so a late voter never writes into a process that gave
//      up, and a process that gave up knows whether anyone committed before it (its targets may
//      hold bytes of the batch) or not (none moved: TransferHooks::withdrawn).
//   3. Move: target buffers are registered with UCX (once per buffer; cached) and published as
//      one table per target process (one store key a source reads once per batch); a source
//      unpacks each registration's remote key once and keeps it across batches. Each source
//      process puts every innermost row of its segments straight into the target buffer
//      (one-sided, no staging copy when the row is contiguous at both ends; a row strided at the
//      source is packed into a staging buffer of at most `staging_bytes` first, a segment dense
//      at the target in chunks of kStagingChunkBytes, one put each; a row strided at the target
//      goes element by element). A target buffer UCX maps into this process (a peer's
//      UCX-allocated memory on the same machine: UcxRemoteKey::mapped) takes every segment but a
//      single contiguous run (still one put) by direct copies instead. Rows whose target is in
//      the same process are copied directly. At most `staging_bytes` are in flight per process:
//      a round ends with a flush of every endpoint it used (then the staging buffer is reused;
//      sooner while every put from it completed in place, as puts into shared memory do).
//   4. Finish: each source process tells each target process how many bytes it put there; a
//      target returns when every source has (its worker progresses meanwhile, as emulated RMA
//      on one machine needs).
// Buffers must stay alive and unchanged (sources) / untouched (targets) during `execute`, and
// target buffers stay registered until the executor is destroyed. The executor keeps remote keys
// unpacked through the UcxPeers' endpoints: destroy it before them.
//
// Statistics per process: bytes_sent (put to other processes), bytes_received (put into this
// process's targets by others), bytes_copied_locally, rounds, puts, and wire_bytes / useful_bytes
// of this process's targets (1.0 when no target element is written twice: plans never do).
//
// Example: (12,10) f32 rows on 2 training ranks (6 rows each) -> columns on 3 rollout ranks
// (4, 3, 3 columns): training rank 0 puts 6 runs of 4 elements (96 bytes) into rollout rank 0 and
// 6 runs of 3 (72 bytes) into ranks 1 and 2; rollout rank 0 receives 192 bytes, useful_bytes 192,
// wire/useful = 1.0.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/local_executor.h"
#include "core/affine/plan.h"
#include "core/config/config.h"  // the defaults of [tessera.transport] / [tessera.rollout], written once there

namespace tessera::transport {

class UcxPeers;
class UcxMemory;
class UcxEndpoint;
class UcxRemoteKey;

// A process of some job.
struct ProcessId {
  std::string job;
  int rank = 0;
  friend bool operator<(const ProcessId& a, const ProcessId& b) {
    return a.job != b.job ? a.job < b.job : a.rank < b.rank;
  }
  friend bool operator==(const ProcessId& a, const ProcessId& b) { return a.job == b.job && a.rank == b.rank; }
};

struct RemoteTransfer {
  const affine::Plan* plan = nullptr;
  std::vector<ProcessId> source_processes;  // plan source rank r lives on source_processes[r]
  std::vector<ProcessId> target_processes;  // plan target rank r lives on target_processes[r]
  std::map<int, affine::LocalBuffer> source_buffers;  // plan source ranks placed on this process
  std::map<int, affine::LocalBuffer> target_buffers;  // plan target ranks placed on this process
};

// What a target learns about its buffers during execute(). Either may be empty.
struct TransferHooks {
  // Before this process casts a vote that accepts the batch: from then on, peers that read
  // unanimous votes may write into its target buffers (a sink pauses in-place generation here).
  std::function<void()> exposed;
  // After `exposed`, when execute() throws knowing no byte was written into this process: the
  // batch was refused everywhere, or withdrawn before any process committed.
  std::function<void()> withdrawn;
};

struct RemoteExecutorOptions {
  int64_t staging_bytes = config::RolloutConfig{}.staging_budget_bytes;  // bytes in flight per process per round
  std::chrono::milliseconds timeout{config::TransportConfig{}.collective_timeout_ms};
  // A process putting more than this into mapped targets in one batch copies with streaming
  // stores (streaming_copy.h), contiguous runs included; 0: always.
  int64_t streaming_copy_bytes = int64_t{32} << 20;
};

struct RemoteTransferStats {
  int64_t segments = 0;              // segments this process sourced
  int64_t puts = 0;                  // one-sided puts issued
  int64_t rounds = 0;
  int64_t bytes_sent = 0;            // put into other processes
  int64_t bytes_received = 0;        // put into this process's targets by others
  int64_t bytes_copied_locally = 0;  // source and target in this process
  int64_t bytes_staged = 0;          // packed into staging first (rows strided at the source)
  int64_t bytes_mapped = 0;          // of bytes_sent: copied straight into a target UCX maps here
  int64_t useful_bytes = 0;          // bytes of this process's target elements (each once)
  int64_t staging_peak_bytes = 0;    // bytes of the staging buffer this batch filled at most in one round
  // (bytes_received + bytes copied into this process's targets) / useful_bytes; 1.0 when no
  // target element arrives twice; 0 when this process holds no target.
  double wire_to_useful = 0;
};

class RemoteExecutor {
 public:
  // `peers` is this process's UCX directory (connected or not; execute() connects what it needs).
  // `session` names the executor's store keys; the same on every process.
  RemoteExecutor(UcxPeers& peers, std::string session, const RemoteExecutorOptions& options = {});
  ~RemoteExecutor();
  RemoteExecutor(const RemoteExecutor&) = delete;
  RemoteExecutor& operator=(const RemoteExecutor&) = delete;

  // `hooks` tell a target when its buffers may start to change, and when a failed call is known
  // to have changed none of them (a sink marks its weights torn, and a withdrawn batch leaves
  // them serving).
  RemoteTransferStats execute(const std::vector<RemoteTransfer>& batch, const TransferHooks& hooks = {});

  // What a process adds to an epoch's commit counter when it gives up on the votes; a committer
  // adds 1, so the counter's value says how many of each came before.
  static constexpr int64_t kWithdraw = int64_t{1} << 32;

  // Hands the executor memory registered elsewhere (e.g. UcxMemory::allocate, which on one
  // machine lets puts land in shared memory without emulation): target buffers inside it are
  // published with their offset instead of being registered again.
  void use_registered(std::shared_ptr<UcxMemory> memory);

  // A segment packed through staging goes in puts of at most this many bytes (fewer when
  // staging_bytes is smaller), each put as soon as it is packed, while the chunk is in cache.
  static constexpr int64_t kStagingChunkBytes = int64_t{256} << 10;

 private:
  struct Call;  // one execute() call, by phase (remote_executor.cpp)
  UcxPeers& peers_;
  std::string session_;
  RemoteExecutorOptions options_;
  uint64_t epoch_ = 0;
  std::vector<std::string> published_;  // memory keys this process published in the last epoch
  // By base address; a target buffer uses the registration that contains it.
  std::map<uintptr_t, std::shared_ptr<UcxMemory>> registrations_;
  std::vector<char> staging_;  // packed rows strided at the source; kept from one batch to the next
  // Remote keys of targets' registrations by (process, descriptor), kept across batches and
  // dropped when no batch named them in the last two epochs.
  struct CachedKey {
    std::shared_ptr<UcxRemoteKey> rkey;
    uint64_t last_epoch = 0;
  };
  std::map<std::pair<ProcessId, std::vector<uint8_t>>, CachedKey> remote_keys_;
  const UcxRemoteKey& remote_key(const ProcessId& target, UcxEndpoint& endpoint, const std::vector<uint8_t>& descriptor,
                                 uint64_t epoch);
  void forget_remote_keys_before(uint64_t epoch);
};

}  // namespace tessera::transport
