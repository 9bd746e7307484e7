// Optimizer offload to NVMe (zero_optimization.offload_optimizer.device = "nvme"): a StateStore
// whose masters and states live in one swap file per rank, read and written with io_uring and
// O_DIRECT (io::UringFile), with `buffers` sub-group records in host memory at most whatever the
// model's size.
//
// On disk each sub-group is one record, [master | state 0 | state 1 ...], every part starting on a
// 4096-byte page, so that one read brings everything the kernel needs for that sub-group. The
// optimizer steps sub-groups in order; acquire(g, s) returns the record (read ahead while the one
// before stepped), and after it the store starts reading the next ones into free buffers; release
// writes the record back behind the next update. Every record's XXH3 is kept from its last write
// and checked on every read, and the file's size before every acquire: a swap file truncated or
// changed behind the engine's back is an OffloadError naming the path, flat group and sub-group,
// raised before that sub-group is updated.
//
// partition_master()/partition_states() (storage maps, checkpoints, refresh: between steps only)
// page the whole partitions into memory and lend them; the next acquire writes them back and frees
// them. So a checkpoint of an NVMe-offloaded run holds its partitions in host memory while it saves.
//
// Example: 4 buffers, sub-groups of 1 M elements, AdamW with fp32 masters: records of 12 MiB, 48 MiB
// of host memory for a model of any size; a step reads and writes each record once.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/io/uring_file.h"
#include "core/optim/state_store.h"

namespace tessera::optim {

struct NvmeStoreOptions {
  std::string path;   // the swap file (its directory exists)
  int64_t buffers = 4;  // sub-group records in host memory at most (at least 3)
  io::AioSettings aio;
};

struct NvmeStoreStats {
  io::IoCounters io;
  int64_t prefetched = 0;   // acquires whose record was already read (or still in memory)
  int64_t waited_reads = 0; // acquires that had to read, or wait for a read still in flight
  double read_wait_s = 0;   // time acquire() waited for reads
  double write_wait_s = 0;  // time spent waiting for writes to free a buffer
};

class NvmeStateStore final : public StateStore {
 public:
  struct Group {
    at::ScalarType master_dtype = at::ScalarType::Undefined;  // Undefined: no master
    std::vector<at::ScalarType> state_dtypes;                  // in the kernel's state_names() order
    std::vector<std::pair<int64_t, int64_t>> sub_groups;       // [begin, end) of the partition
  };
  // fill(g, s): sub-group s of group g's initial master and states, written once at construction.
  using Fill = std::function<SubGroupState(int64_t group, int64_t sub_group)>;
  NvmeStateStore(std::vector<Group> groups, const Fill& fill, NvmeStoreOptions options);
  ~NvmeStateStore() override;

  SubGroupState acquire(int64_t group, int64_t sub_group) override;
  void release(int64_t group, int64_t sub_group) override;
  at::Tensor partition_master(int64_t group) const override;
  std::vector<at::Tensor> partition_states(int64_t group) const override;
  int64_t master_bytes() const override;  // in memory now: a paged-in partition, else 0
  int64_t state_bytes() const override;

  // Waits for every read and write in flight (the optimizer-shard at the end of a step: a step
  // returns with its states in the file), then starts reading the first sub-groups' records for
  // the next step into the buffers, so that their reads hide behind its forward and backward.
  void flush();

  int64_t buffer_bytes() const;  // the records' buffers
  int64_t file_bytes() const;    // the swap file
  const std::string& path() const;
  NvmeStoreStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::optim
