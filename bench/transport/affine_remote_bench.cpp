// Cross-job affine transfer: a (rows, cols) f32 tensor (default 8192 x 16384 = 512 MiB) held as
// TP rows on S training ranks moves to TP columns on T rollout ranks (defaults S = 2, T = 4),
// through RemoteExecutor (one-sided puts straight into the targets), against
//   - gather-then-scatter over the same transport: rows -> the whole tensor on rollout rank 0,
//     then whole -> columns (two executor runs), and
//   - memcpy of the same bytes in one process.
// Run as ONE launch of S + T ranks (ranks < S act as job "train", the rest as job "rollout"; the
// transport path is the one two separately launched jobs use):
//   tools/tessera-launch --nproc-per-node 6 build/bench/transport/bench_affine_remote [rows cols S reps]
// Target buffers are UCX-allocated (shared memory on one machine) and handed to the executor.
// The first run is validated element by element; times are the slowest process, best of `reps`.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "core/affine/builders.h"
#include "core/affine/planner.h"
#include "transport/affine/remote_executor.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

using namespace tessera;
using namespace tessera::transport;
using Clock = std::chrono::steady_clock;

namespace {

float value(int64_t linear) { return static_cast<float>(linear % 1000003) * 0.25f; }

// Every process waits here; returns when all `n` arrived (named by `key`).
void barrier(Store& store, const std::string& key, int n) {
  store.add(key, 1);
  while (store.add(key, 0) < n) std::this_thread::sleep_for(std::chrono::microseconds(200));
}

}  // namespace

int main(int argc, char** argv) {
  const int world_rank = std::atoi(std::getenv("RANK"));
  const int world = std::atoi(std::getenv("WORLD_SIZE"));
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 8192, cols = argc > 2 ? std::atoll(argv[2]) : 16384;
  const int S = argc > 3 ? std::atoi(argv[3]) : 2, T = world - S;
  const int reps = argc > 4 ? std::atoi(argv[4]) : 3;
  const bool is_source = world_rank < S;
  const int rank = is_source ? world_rank : world_rank - S;
  const std::string job = is_source ? "train" : "rollout";
  auto store = Store::from_env();
  UcxContext context({});
  UcxPeers peers(context, store, job, rank, is_source ? S : T, "affine-bench");
  peers.connect("train");
  peers.connect("rollout");
  auto shared = peers.store();

  const affine::TensorInfo info{"w", affine::DType::f32, {rows, cols}};
  const auto source_map = affine::contiguous_split(info, 0, affine::even_split_sizes(rows, S));
  const auto target_map = affine::contiguous_split(info, 1, affine::even_split_sizes(cols, T));
  const auto whole = affine::replicated(info, 1);
  const auto direct_plan = affine::plan(target_map, source_map);
  const auto gather_plan = affine::plan(whole, source_map);
  const auto scatter_plan = affine::plan(target_map, whole);

  std::vector<float> source;
  std::shared_ptr<UcxMemory> target, gathered;
  if (is_source) {
    const auto& piece = source_map.ranks.at(rank).pieces.at(0);
    source.resize(source_map.ranks.at(rank).buffer_elements);
    for (int64_t r = 0; r < piece.box.shape[0]; ++r)
      for (int64_t c = 0; c < cols; ++c) source[r * cols + c] = value((piece.box.origin[0] + r) * cols + c);
  } else {
    target = UcxMemory::allocate(context, target_map.ranks.at(rank).buffer_elements * 4);
    if (rank == 0) gathered = UcxMemory::allocate(context, rows * cols * 4);
  }
  RemoteExecutor direct(peers, "direct"), gather(peers, "gather"), scatter(peers, "scatter");
  if (target) direct.use_registered(target), scatter.use_registered(target);
  if (gathered) gather.use_registered(gathered);

  auto placement = [](const std::string& job, int n) {
    std::vector<ProcessId> v;
    for (int i = 0; i < n; ++i) v.push_back({job, i});
    return v;
  };
  auto transfer = [&](const affine::Plan& plan, const std::string& src_job, int src_n, const std::string& dst_job,
                      int dst_n, void* src, int64_t src_elements, void* dst, int64_t dst_elements) {
    RemoteTransfer t;
    t.plan = &plan;
    t.source_processes = placement(src_job, src_n);
    t.target_processes = placement(dst_job, dst_n);
    if (src) t.source_buffers[src_job == job ? rank : 0] = {src, src_elements, affine::DType::f32};
    if (dst) t.target_buffers[dst_job == job ? rank : 0] = {dst, dst_elements, affine::DType::f32};
    return std::vector<RemoteTransfer>{t};
  };
  const int64_t target_elements = is_source ? 0 : target_map.ranks.at(rank).buffer_elements;
  float* target_data = target ? static_cast<float*>(target->address()) : nullptr;

  auto slowest = [&](const std::string& key, double seconds) {
    shared->set(key + "/" + std::to_string(world_rank), std::to_string(seconds));
    double worst = 0;
    for (int r = 0; r < world; ++r) worst = std::max(worst, std::stod(shared->get_string(key + "/" + std::to_string(r))));
    return worst;
  };
  bool valid = true;
  double best_direct = 1e30, best_baseline = 1e30;
  int64_t rounds = 0;
  double wire = 0;
  for (int rep = 0; rep < reps; ++rep) {
    if (target_data) std::memset(target_data, 0xFF, target_elements * 4);
    barrier(*shared, "start/" + std::to_string(rep), world);
    auto t0 = Clock::now();
    auto stats = direct.execute(transfer(direct_plan, "train", S, "rollout", T, is_source ? source.data() : nullptr,
                                         source.size(), target_data, target_elements));
    double d = std::chrono::duration<double>(Clock::now() - t0).count();
    rounds = std::max(rounds, stats.rounds);
    if (!is_source) wire = stats.wire_to_useful;
    if (rep == 0 && target_data) {  // validate every element
      const auto& piece = target_map.ranks.at(rank).pieces.at(0);
      const int64_t w = piece.box.shape[1];
      for (int64_t r = 0; r < rows && valid; ++r)
        for (int64_t c = 0; c < w; ++c)
          if (target_data[r * w + c] != value(r * cols + piece.box.origin[1] + c)) {
            valid = false;
            break;
          }
    }
    best_direct = std::min(best_direct, slowest("direct/" + std::to_string(rep), d));

    if (target_data) std::memset(target_data, 0xFF, target_elements * 4);
    barrier(*shared, "base/" + std::to_string(rep), world);
    t0 = Clock::now();
    gather.execute(transfer(gather_plan, "train", S, "rollout", 1, is_source ? source.data() : nullptr, source.size(),
                            gathered ? gathered->address() : nullptr, rows * cols));
    scatter.execute(transfer(scatter_plan, "rollout", 1, "rollout", T, gathered ? gathered->address() : nullptr,
                             rows * cols, target_data, target_elements));
    d = std::chrono::duration<double>(Clock::now() - t0).count();
    best_baseline = std::min(best_baseline, slowest("baseline/" + std::to_string(rep), d));
  }
  shared->set("valid/" + std::to_string(world_rank), valid ? "1" : "0");
  if (world_rank == 0) {
    bool all_valid = true;
    for (int r = 0; r < world; ++r) all_valid = all_valid && shared->get_string("valid/" + std::to_string(r)) == "1";
    const double bytes = rows * cols * 4.0;
    std::vector<char> a(static_cast<size_t>(bytes)), b(static_cast<size_t>(bytes));
    std::memset(a.data(), 1, a.size());
    std::memset(b.data(), 2, b.size());
    double memcpy_s = 1e30;
    for (int i = 0; i < reps; ++i) {
      auto t0 = Clock::now();
      std::memcpy(b.data(), a.data(), a.size());
      memcpy_s = std::min(memcpy_s, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    std::printf("affine_remote bytes=%.0f S=%d T=%d valid=%d\n", bytes, S, T, all_valid);
    std::printf("  direct (executor)      %8.3f s  %6.2f GB/s  rounds=%lld\n", best_direct, bytes / best_direct / 1e9,
                (long long)rounds);
    std::printf("  gather-then-scatter    %8.3f s  %6.2f GB/s  ratio direct/baseline speed = %.2f\n", best_baseline,
                bytes / best_baseline / 1e9, best_baseline / best_direct);
    std::printf("  memcpy (1 process)     %8.3f s  %6.2f GB/s  ratio direct/memcpy speed = %.2f\n", memcpy_s,
                bytes / memcpy_s / 1e9, memcpy_s / best_direct);
    std::printf("config: rows=%lld cols=%lld f32 reps=%d (best of, slowest process) UCX_TLS=%s\n", (long long)rows,
                (long long)cols, reps, std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "(default)");
  }
  barrier(*shared, "end", world);  // rank 0 hosts the store
  (void)wire;
  return valid ? 0 : 1;
}
