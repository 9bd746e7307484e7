#include "actors/core_pool.h"

#include <hwloc.h>
#include <sched.h>

#include <algorithm>
#include <memory>
#include <utility>

#include "core/error.h"

namespace tessera::actors {
namespace {

// The process's CPU set and its physical cores, from hwloc's view of the machine.
class Topology {
 public:
  Topology() {
    if (hwloc_topology_init(&topology_) != 0 || hwloc_topology_load(topology_) != 0)
      throw Error("core pool: hwloc could not read the machine's topology");
    allowed_ = hwloc_bitmap_alloc();
    if (hwloc_get_cpubind(topology_, allowed_, HWLOC_CPUBIND_PROCESS) != 0)
      hwloc_bitmap_copy(allowed_, hwloc_topology_get_allowed_cpuset(topology_));
  }
  ~Topology() {
    hwloc_bitmap_free(allowed_);
    hwloc_topology_destroy(topology_);
  }
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  // The CPUs of the k-th core (mod their number) inside the process's set; a copy the caller frees.
  hwloc_bitmap_t core(int k) const {
    const int cores = hwloc_get_nbobjs_inside_cpuset_by_type(topology_, allowed_, HWLOC_OBJ_CORE);
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (cores <= 0) {  // no core objects (some VMs): one CPU of the set per worker
      const int cpus = std::max(1, hwloc_bitmap_weight(allowed_));
      int cpu = hwloc_bitmap_first(allowed_);
      for (int i = 0; i < k % cpus; ++i) cpu = hwloc_bitmap_next(allowed_, cpu);
      hwloc_bitmap_only(set, unsigned(std::max(cpu, 0)));
      return set;
    }
    const hwloc_obj_t obj = hwloc_get_obj_inside_cpuset_by_type(topology_, allowed_, HWLOC_OBJ_CORE, unsigned(k % cores));
    hwloc_bitmap_and(set, obj->cpuset, allowed_);
    return set;
  }
  // Binds the calling thread to `set`.
  void bind_this_thread(hwloc_const_bitmap_t set) const {
    if (hwloc_set_cpubind(topology_, set, HWLOC_CPUBIND_THREAD | HWLOC_CPUBIND_STRICT) != 0 &&
        hwloc_set_cpubind(topology_, set, HWLOC_CPUBIND_THREAD) != 0)
      throw Error("core pool: cannot bind a thread to CPUs " + text(set));
  }
  static std::string text(hwloc_const_bitmap_t set) {
    char buffer[256] = {};
    hwloc_bitmap_list_snprintf(buffer, sizeof buffer, set);
    return buffer;
  }

 private:
  hwloc_topology_t topology_ = nullptr;
  hwloc_bitmap_t allowed_ = nullptr;
};

// The calling thread's CPU affinity as the kernel reports it, as a list ("2-3").
std::string thread_affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    out += (out.empty() ? "" : ",") + std::to_string(cpu) + (last > cpu ? "-" + std::to_string(last) : "");
    cpu = last;
  }
  return out;
}

}  // namespace

CorePool::CorePool(int threads, CoreBinding binding) {
  if (threads < 1) throw Error("core pool: " + std::to_string(threads) + " threads");
  std::unique_ptr<Topology> topology;
  if (binding == CoreBinding::per_core) topology = std::make_unique<Topology>();
  bound_to_.assign(size_t(threads), "");
  // Each worker binds itself before its first job and reports what the kernel says it got.
  std::vector<std::exception_ptr> failures(static_cast<size_t>(threads));
  std::mutex started_mutex;
  std::condition_variable started_cv;
  int started = 0;
  for (int k = 0; k < threads; ++k) {
    workers_.emplace_back([this, k, &topology, &failures, &started_mutex, &started_cv, &started] {
      try {
        if (topology) {
          hwloc_bitmap_t set = topology->core(k);
          try {
            topology->bind_this_thread(set);
          } catch (...) {
            hwloc_bitmap_free(set);
            throw;
          }
          hwloc_bitmap_free(set);
          bound_to_[size_t(k)] = thread_affinity();
        }
      } catch (...) {
        failures[size_t(k)] = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(started_mutex);
        ++started;
      }
      started_cv.notify_one();
      work(k);
    });
  }
  std::unique_lock<std::mutex> lock(started_mutex);
  started_cv.wait(lock, [&] { return started == threads; });
  lock.unlock();
  for (const auto& f : failures)
    if (f) {
      stop();  // the workers end before the error leaves the constructor
      std::rethrow_exception(f);
    }
}

CorePool::~CorePool() { stop(); }

void CorePool::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_)
    if (w.joinable()) w.join();
  workers_.clear();
}

void CorePool::work(int k) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job = nullptr;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
      if (stopping_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr error;
    try {
      (*job)(k);
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (error && !error_) error_ = error;
    if (--running_ == 0) done_.notify_one();
  }
}

void CorePool::run(const std::function<void(int)>& fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  job_ = &fn;
  error_ = nullptr;
  running_ = size();
  ++generation_;
  wake_.notify_all();
  done_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

std::pair<int64_t, int64_t> worker_run(int64_t n, int k, int workers, int64_t min_run) {
  const int64_t per = std::max<int64_t>((n + workers - 1) / std::max(1, workers), std::min(n, min_run));
  const int64_t step = (per + 63) / 64 * 64;
  const int64_t begin = std::min(n, int64_t(k) * step);
  return {begin, std::min(n, begin + step)};
}

}  // namespace tessera::actors
