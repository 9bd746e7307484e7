// Gloo bus bandwidth through tessera's Communicator, run with tessera-launch (2 or more ranks):
//   all_reduce (fp32, bf16) vs c10d's ProcessGroupGloo allreduce called directly (the ratio is
//   tessera's overhead: sequencer, arrival record, bf16 upcast);
//   reduce_scatter (gloo's halving-doubling) vs the c10d workaround "allreduce, keep my chunk";
// busbw = bytes * 2(n-1)/n / t for all-reduce, bytes * (n-1)/n / t for reduce-scatter (nccl-tests'
// convention; bytes = the full buffer). Also memcpy of the same bytes, for scale.
// Output: one line per (op, size) with GB/s and ratios, then the configuration.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "transport/communicator.h"
#include "transport/detail/c10d_store.h"
#include "transport/store.h"

using namespace tessera::transport;

namespace {

template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  const int rank = std::atoi(std::getenv("RANK"));
  const int n = std::atoi(std::getenv("WORLD_SIZE"));
  auto store = Store::from_env();
  auto comm = Communicator::gloo(store, rank, n);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(300));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 2;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10d_store(*store, "bench_pg"), rank, n, opts);
  const int reps = 5;
  if (rank == 0) std::printf("%-16s %6s %10s %10s %10s %8s %10s\n", "op", "dtype", "MiB", "GB/s", "base GB/s", "ratio", "memcpy");
  for (int64_t mib : {1, 8, 64}) {
    const int64_t elements = mib * (1 << 20) / 4;
    const double bytes = elements * 4.0;
    auto src = torch::rand({elements});
    auto dst = torch::empty_like(src);
    double memcpy_s = best_seconds(reps, [&] { std::memcpy(dst.data_ptr(), src.data_ptr(), bytes); });
    // Validate once: the sum of ones is n.
    auto one = torch::ones({elements});
    comm->all_reduce(one)->wait();
    if (one[elements - 1].item<float>() != n) return std::fprintf(stderr, "all_reduce wrong\n"), 1;
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      auto t = torch::ones({elements}, dtype);
      auto t_base = torch::ones({elements});
      double ours = best_seconds(reps, [&] { comm->all_reduce(t)->wait(); });
      double base = best_seconds(reps, [&] {
        std::vector<at::Tensor> v{t_base};
        pg->allreduce(v)->wait();
      });
      const double factor = 2.0 * (n - 1) / n;
      if (rank == 0)
        std::printf("%-16s %6s %10lld %10.2f %10.2f %8.2f %10.2f\n", "all_reduce", dtype == torch::kFloat ? "fp32" : "bf16",
                    (long long)mib, bytes * factor / ours / 1e9, bytes * factor / base / 1e9, base / ours,
                    bytes / memcpy_s / 1e9);
    }
    auto in = torch::ones({elements});
    auto out = torch::empty({elements / n});
    double ours = best_seconds(reps, [&] { comm->reduce_scatter(in, out)->wait(); });
    auto full = torch::ones({elements});
    double base = best_seconds(reps, [&] {
      std::vector<at::Tensor> v{full};
      pg->allreduce(v)->wait();
      out.copy_(full.narrow(0, rank * (elements / n), elements / n));
    });
    const double factor = 1.0 * (n - 1) / n;
    if (rank == 0)
      std::printf("%-16s %6s %10lld %10.2f %10.2f %8.2f %10.2f\n", "reduce_scatter", "fp32", (long long)mib,
                  bytes * factor / ours / 1e9, bytes * factor / base / 1e9, base / ours, bytes / memcpy_s / 1e9);
  }
  comm->barrier()->wait();
  if (rank == 0)
    std::printf("config: world=%d reps=%d (best of) baseline=c10d ProcessGroupGloo allreduce; reduce_scatter "
                "baseline=allreduce+narrow; threads=%d\n", n, reps, at::get_num_threads());
  return 0;
}
