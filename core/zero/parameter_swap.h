// Parameters on NVMe (zero_optimization.offload_param.device = "nvme", ZeRO-3): one rank's weight
// partitions (per flat group, the low-precision values its gathers send and its optimizer writes)
// in one swap file under nvme_path, read and written with io_uring and O_DIRECT (io::UringFile),
// with at most `buffers` chunks of `chunk_bytes` in host memory whatever the model's size.
//
// Each partition starts on a chunk of its own: chunk k of flat group g holds the partition's bytes
// [k·C, (k+1)·C) (C: chunk_bytes, at most the largest partition's bytes rounded up to a page). read()/write() of an element range go through the chunks that cover it: a chunk
// not in memory is read (and checked against the XXH3 of its last write), into a free buffer or the
// least recently used one (a changed chunk there is written back first). A writer that starts at a
// chunk's beginning and goes on where it stopped reads nothing of it (the rest is read, into one
// scratch chunk, only if something else needs the chunk first). A write that reaches a chunk's end
// starts writing that chunk back at once (the optimizer writes partitions in order: write-behind). prefetch() starts reads of a range's chunks into buffers that hold nothing
// changed, without waiting, so that the gathers of the next units read ahead along the prefetch
// order. flush() writes every changed chunk and waits. One mutex guards everything: the
// parameter-shard (gathers) and the optimizer-shard (updates) share a swap.
//
// Errors are OffloadErrors naming the path, flat group and elements: a chunk read back that is not
// what was written (changed behind the engine's back), a truncated file, an I/O error, a range
// outside the partition. A failed read() may have filled the destination's earlier chunks; the
// file and the other chunks are unchanged. A chunk never written reads as zeros without I/O.
//
// Example: 4 buffers of 8 MiB, a bf16 partition of 100 M elements (200 MB): 24 chunks on disk and
// 32 MiB of host memory; reading elements [0, 5 M) reads chunks 0 and 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/io/uring_file.h"
#include "core/zero/weight_home.h"

namespace tessera::zero {

struct ParameterSwapStats {
  io::IoCounters io;
  int64_t hits = 0;     // chunk uses served from memory (kept, or read ahead and done)
  int64_t misses = 0;   // chunk uses that read, or waited for a read still in flight
  int64_t write_backs = 0;
  double read_wait_s = 0;
  double write_wait_s = 0;  // waiting for a write to free a buffer or to change a chunk again
};

class ParameterSwap {
 public:
  struct Partition {
    at::ScalarType dtype;
    int64_t numel;
  };
  ParameterSwap(std::vector<Partition> partitions, ParameterSwapOptions options);
  ~ParameterSwap();  // waits for writes in flight; the file is removed
  ParameterSwap(const ParameterSwap&) = delete;
  ParameterSwap& operator=(const ParameterSwap&) = delete;

  // dst / src: contiguous 1-D CPU tensors of the partition's dtype; [begin, begin + numel) inside it.
  void read(int64_t group, int64_t begin, const at::Tensor& dst);
  void write(int64_t group, int64_t begin, const at::Tensor& src);
  void prefetch(int64_t group, int64_t begin, int64_t numel);
  void flush();
  at::Tensor read_whole(int64_t group);  // a new host tensor holding the partition

  const std::vector<Partition>& partitions() const;
  int64_t buffer_bytes() const;  // host memory of the chunks' buffers (and the scratch chunk, once made)
  int64_t file_bytes() const;
  const std::string& path() const;
  ParameterSwapStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::zero
