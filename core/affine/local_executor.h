// The local executor runs a batch of plans between buffers of one process (several "ranks" living in
// one process: tests, checkpoints, engines sharing a process). The remote executor of transport/
// reuses its checks (validate_local_batch), chunking (chunking.h) and statistics.
//
// Refusals, all before any byte moves (TransferRefusedError / BudgetExceededError):
//   a rank a plan names without a buffer; a buffer whose dtype differs from the plan's; a segment
//   reaching outside its buffer (or with a non-positive extent); a source buffer that shares bytes with
//   a target buffer; a target byte written twice within the batch, including through two buffers that
//   alias the same memory (a ZeRO-3 master that is the weight partition) or two requests whose
//   targets overlap; a budget smaller than one element.
// Copies are strided -> strided with axes contiguous on both sides collapsed, so most segments are a
// few memcpy calls. The staging budget bounds the bytes per round; with `through_staging` every round
// is packed into one staging buffer of at most budget bytes and unpacked from it (the remote path's
// data flow), otherwise copies go directly from source to target.
//
// Example: 256 MiB f32 moved from rows on 2 ranks to columns on 4 ranks with the default 64 MiB
// budget: stats.bytes_copied = 268,435,456, chunks >= 8, rounds = 4.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "core/affine/plan.h"

namespace tessera::affine {

struct LocalBuffer {
  void* data = nullptr;
  int64_t elements = 0;
  DType dtype = DType::f32;
};

struct LocalTransfer {
  const Plan* plan = nullptr;
  std::map<int, LocalBuffer> source_buffers;  // by source rank of the plan
  std::map<int, LocalBuffer> target_buffers;  // by target rank of the plan
};

struct LocalExecutorOptions {
  int64_t staging_bytes = int64_t{64} << 20;  // bytes per round
  bool through_staging = false;
  int64_t max_overlap_runs = int64_t{1} << 24;  // safety limit of the interleaved-target check
  // validate_local_batch only: check just the sides whose buffers this process holds (the remote
  // executor validates each process's part this way, then agrees on a verdict). execute_local
  // refuses it: a local batch needs every buffer.
  bool only_held_buffers = false;
};

struct TransferStats {
  int64_t segments = 0;
  int64_t chunks = 0;
  int64_t rounds = 0;
  int64_t bytes_copied = 0;
  int64_t copy_runs = 0;  // memcpy calls (or elements of strided innermost axes)
};

// Every refusal above, without moving data.
void validate_local_batch(const std::vector<LocalTransfer>& batch, const LocalExecutorOptions& options = {});

TransferStats execute_local(const std::vector<LocalTransfer>& batch, const LocalExecutorOptions& options = {});

}  // namespace tessera::affine
