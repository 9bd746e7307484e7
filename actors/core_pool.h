// CorePool: the threads a rank's host optimizer updates run on (optimizer offload: a sub-group
// cut into one contiguous run per thread; every kernel is elementwise, so the bits are one
// thread's). Bound, each thread is pinned (hwloc) to one physical core of the cores this process
// may use, which tessera-launch --bind-cores-to-rank makes the rank's own share: the ranks of a
// node do not fight over cores and no thread migrates between them. Unbound, the threads go where
// the OS puts them.
//
// run(fn) calls fn(k) on worker k for every k in [0, size()) and returns when all are done,
// rethrowing the first exception; one run at a time (the optimizer-shard's thread).
//
// Example: tessera-launch --bind-cores-to-rank --nproc-per-node 2 on 8 cores: each rank is bound to
// 4 cores and has OMP_NUM_THREADS=4, so its pool has 4 threads, thread k on the rank's k-th core.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::actors {

enum class CoreBinding : uint8_t {
  none,      // the OS schedules the threads
  per_core,  // thread k on physical core k (mod their number) of the process's CPU set
};

class CorePool {
 public:
  CorePool(int threads, CoreBinding binding);  // threads >= 1; binding errors name the core
  ~CorePool();
  CorePool(const CorePool&) = delete;
  CorePool& operator=(const CorePool&) = delete;

  int size() const { return int(workers_.size()); }
  // Worker k's CPU set as Linux writes lists ("2-3"), read back from the thread after binding ("" unbound).
  const std::vector<std::string>& bound_to() const { return bound_to_; }
  void run(const std::function<void(int)>& fn);

 private:
  void work(int k);
  void stop();  // ends and joins the workers

  std::vector<std::thread> workers_;
  std::vector<std::string> bound_to_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr error_;
};

// The cut of [0, n) that worker k of `workers` steps: contiguous, in worker order, each a multiple
// of 64 elements but the last, none under `min_run` elements unless n is (idle workers get none).
std::pair<int64_t, int64_t> worker_run(int64_t n, int k, int workers, int64_t min_run = 256);

}  // namespace tessera::actors
