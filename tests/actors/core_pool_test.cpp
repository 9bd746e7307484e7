// CorePool (the host optimizer's threads) and worker_run (its cut of a sub-group): every worker
// runs each job once and the cut covers [0, n) exactly, contiguous and in order; an exception in
// a worker reaches the caller and the pool goes on; bound, each worker's CPU affinity, read by the
// kernel from inside the job, is one core of the process's CPU set, distinct cores while there are
// enough (the negative control: unbound workers keep the process's whole set).
#include <catch2/catch.hpp>

#include <sched.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/core_pool.h"

using tessera::actors::CoreBinding;
using tessera::actors::CorePool;
using tessera::actors::worker_run;

namespace {

std::set<int> affinity() {
  cpu_set_t set;
  CPU_ZERO(&set);
  REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  std::set<int> out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
    if (CPU_ISSET(cpu, &set)) out.insert(cpu);
  return out;
}

}  // namespace

TEST_CASE("worker_run cuts 0 to n into contiguous runs in worker order", "[core_pool]") {
  for (int64_t n : {0, 1, 63, 64, 255, 1000, 4097, 1'000'003}) {
    for (int workers : {1, 2, 3, 8}) {
      INFO("n " << n << ", workers " << workers);
      int64_t next = 0;
      for (int k = 0; k < workers; ++k) {
        const auto [b, e] = worker_run(n, k, workers);
        CHECK(b == next);
        CHECK(e >= b);
        if (e > b && e < n) CHECK((e - b) % 64 == 0);
        next = e;
      }
      CHECK(next == n);
    }
  }
  CHECK(worker_run(1000, 1, 2).first == 512);  // sub-groups of the tests' size are split too
}

TEST_CASE("CorePool runs every worker once per job and passes on a worker's exception", "[core_pool]") {
  CorePool pool(3, CoreBinding::none);
  REQUIRE(pool.size() == 3);
  for (int round = 0; round < 50; ++round) {
    std::vector<std::atomic<int>> calls(3);
    pool.run([&](int k) { ++calls[size_t(k)]; });
    for (auto& c : calls) CHECK(c.load() == 1);
  }
  CHECK_THROWS_WITH(pool.run([](int k) {
    if (k == 2) throw std::runtime_error("worker 2 failed");
  }), "worker 2 failed");
  std::atomic<int> after{0};
  pool.run([&](int) { ++after; });
  CHECK(after.load() == 3);
}

TEST_CASE("A bound CorePool pins each worker to one core of the process's CPU set", "[core_pool]") {
  const auto process = affinity();
  const int workers = int(process.size());
  CorePool bound(workers, CoreBinding::per_core);
  std::vector<std::set<int>> seen(static_cast<size_t>(workers));
  bound.run([&](int k) { seen[size_t(k)] = affinity(); });
  std::set<int> used;
  for (int k = 0; k < workers; ++k) {
    INFO("worker " << k << " bound to " << bound.bound_to()[size_t(k)]);
    CHECK_FALSE(seen[size_t(k)].empty());
    CHECK(seen[size_t(k)].size() <= 2);  // one core: its hyperthreads at most
    for (int cpu : seen[size_t(k)]) CHECK(process.count(cpu) == 1);
    CHECK_FALSE(bound.bound_to()[size_t(k)].empty());
    for (int cpu : seen[size_t(k)]) used.insert(cpu);
  }
  if (workers > 1 && seen[0].size() == 1) CHECK(int(used.size()) == workers);  // distinct cores
  // Negative control: unbound workers keep the whole set.
  CorePool free(2, CoreBinding::none);
  std::vector<std::set<int>> loose(2);
  free.run([&](int k) { loose[size_t(k)] = affinity(); });
  CHECK(loose[0] == process);
  CHECK(free.bound_to()[0].empty());
}
