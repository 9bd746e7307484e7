// A swap file read and written with io_uring and O_DIRECT: what optimizer offload to NVMe keeps its
// states in. The file is created (replacing a crashed run's leftover, which is never trusted),
// preallocated to its full size with fallocate so that a full disk is an error at creation and not
// half-way through a step, locked (flock) so that two live engines cannot share it, and removed when
// the object goes.
//
// Requests are split into `block_size` pieces and spread over `threads` workers, each with its own
// ring of `queue_depth` entries (DeepSpeed's aio block: block_size, queue_depth, thread_count /
// intra_op_parallelism, single_submit, overlap_events). submit() returns at once; wait() blocks until
// every piece of that request completed, or throws OffloadError naming the path, offset and cause:
// an I/O error, a file that ends early (truncated behind the engine's back), or no completion
// within `timeout`. O_DIRECT: buffers, offsets and sizes are multiples of kAlignment (checked).
//
// Example: a 12 MiB read with block_size 1 MiB, 2 threads, queue_depth 8: 12 pieces, 6 per worker,
// all in flight at once; wait() returns when the 12th completes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace tessera::io {

struct AioSettings {
  int64_t block_size = 1 << 20;  // bytes per request piece
  int64_t queue_depth = 8;       // pieces in flight per worker
  int64_t threads = 1;           // workers (rings)
  bool single_submit = false;    // one io_uring_submit per piece instead of per batch
  bool overlap_events = true;    // refill the ring as pieces complete, not batch by batch
  std::chrono::milliseconds timeout{std::chrono::minutes(2)};  // per request
};

enum class IoDirection { read, write };

struct IoCounters {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t requests = 0;
  int64_t pieces = 0;
  int64_t fsyncs = 0;  // none: a swap file need not survive a crash (its leftovers are replaced)
};

class UringFile {
 public:
  static constexpr int64_t kAlignment = 4096;
  struct Request;
  using Ticket = std::shared_ptr<Request>;

  // OffloadError naming the path: cannot be created, another live process holds it, or the disk
  // cannot hold `size_bytes` (fallocate: ENOSPC), or io_uring is unavailable.
  UringFile(std::string path, int64_t size_bytes, AioSettings settings);
  ~UringFile();  // stops the workers and removes the file
  UringFile(const UringFile&) = delete;
  UringFile& operator=(const UringFile&) = delete;

  Ticket submit(IoDirection direction, void* buffer, int64_t bytes, int64_t offset, std::string what);
  void wait(const Ticket& ticket);
  bool completed(const Ticket& ticket) const;  // every piece done (wait() still reports its errors)

  int64_t size_bytes_now() const;  // fstat: a truncated file shows here before any read
  int64_t size_bytes() const { return size_bytes_; }  // as created
  const std::string& path() const { return path_; }
  IoCounters counters() const;
  // Whether the file was a leftover of an earlier (crashed) run, replaced at creation.
  bool replaced_leftover() const { return replaced_leftover_; }

 private:
  struct Worker;
  std::string path_;
  int64_t size_bytes_;
  AioSettings settings_;
  int fd_ = -1;
  bool replaced_leftover_ = false;
  std::unique_ptr<Worker[]> workers_;
  int64_t next_worker_ = 0;
  mutable struct Totals {
    int64_t bytes_read = 0, bytes_written = 0, requests = 0, pieces = 0;
  } totals_;
};

}  // namespace tessera::io
