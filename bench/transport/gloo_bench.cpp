// Gloo collectives through tessera's Communicator against c10d's ProcessGroupGloo called directly
// in the same run, one JSON line per (op, dtype, size), run with tessera-launch (2 or more ranks):
//   tools/tessera-launch --nproc-per-node 2 build/bench/transport/bench_gloo [min_bytes max_bytes]
// Sizes are the buffer's bytes in fp32 (4 KiB to 256 MiB by default, x4 apart); bf16 runs the same
// element count. Ops:
//   all_reduce fp32/bf16 vs c10d's allreduce of the same tensor (bf16 vs c10d fp32 of the same
//     elements where c10d 1.13 refuses bf16; "baseline_dtype" says which);
//   reduce_scatter fp32 vs the c10d workaround "allreduce, keep my chunk".
// busbw = bytes * 2(n-1)/n / t for all-reduce, bytes * (n-1)/n / t for reduce-scatter (nccl-tests'
// convention, bytes = the full buffer). Each rep times tessera and c10d back to back, alternating
// which goes first, so that load from other work falls on both; the medians are reported.
// "ratio_to_c10d" = c10d's median time / tessera's (> 1: tessera faster).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "bench/common/commit.h"
#include "transport/communicator.h"
#include "transport/detail/c10d_store.h"
#include "transport/store.h"

using namespace tessera::transport;

namespace {

double seconds_of(const std::function<void()>& f) {
  auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Enough reps that a small size's median is not one scheduler hiccup, few at the large sizes.
int reps_for(int64_t bytes) { return bytes <= (1 << 20) ? 31 : bytes <= (16 << 20) ? 11 : 5; }

struct Timing {
  double ours_s, base_s;
};

// One warm-up call of each (scratch buffers, first-touch pages), then alternating timed pairs.
Timing time_pair(int reps, const std::function<void()>& ours, const std::function<void()>& base) {
  ours();
  base();
  std::vector<double> o, b;
  for (int i = 0; i < reps; ++i) {
    if (i % 2 == 0) {
      o.push_back(seconds_of(ours));
      b.push_back(seconds_of(base));
    } else {
      b.push_back(seconds_of(base));
      o.push_back(seconds_of(ours));
    }
  }
  return {median(o), median(b)};
}

// Rank r's input: (i % 7) + r, integers exact in bf16 and fp32 at these sizes, so every rank's
// result must equal the closed form sum_r ((i % 7) + r) = n (i % 7) + n (n - 1) / 2.
at::Tensor input_of(int64_t elements, int rank, at::ScalarType dtype) {
  return (torch::arange(elements, torch::kLong).remainder(7) + rank).to(dtype);
}

bool all_reduce_right(Communicator& comm, int64_t elements, int rank, int n, at::ScalarType dtype) {
  auto t = input_of(elements, rank, dtype);
  comm.all_reduce(t)->wait();
  auto expect = (torch::arange(elements, torch::kLong).remainder(7) * n + n * (n - 1) / 2).to(dtype);
  return torch::equal(t, expect);
}

bool c10d_takes(c10d::ProcessGroupGloo& pg, at::ScalarType dtype) {
  try {
    std::vector<at::Tensor> v{torch::ones({4}, dtype)};
    pg.allreduce(v)->wait();
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void print(int rank, const char* op, const char* dtype, const char* base_dtype, int64_t bytes, int n, double factor,
           Timing t, int reps, const std::string& sha) {
  if (rank != 0) return;
  std::printf("{\"bench\":\"gloo\",\"op\":\"%s\",\"dtype\":\"%s\",\"baseline_dtype\":\"%s\",\"bytes_fp32\":%lld,"
              "\"world\":%d,\"median_us\":%.1f,\"c10d_median_us\":%.1f,\"busbw_gbs\":%.3f,\"c10d_busbw_gbs\":%.3f,"
              "\"ratio_to_c10d\":%.3f,\"reps\":%d,\"threads\":%d,\"commit\":\"%s\"}\n",
              op, dtype, base_dtype, (long long)bytes, n, t.ours_s * 1e6, t.base_s * 1e6, bytes * factor / t.ours_s / 1e9,
              bytes * factor / t.base_s / 1e9, t.base_s / t.ours_s, reps, at::get_num_threads(), sha.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int rank = std::atoi(std::getenv("RANK"));
  const int n = std::atoi(std::getenv("WORLD_SIZE"));
  const int64_t min_bytes = argc > 1 ? std::atoll(argv[1]) : 4 << 10;
  const int64_t max_bytes = argc > 2 ? std::atoll(argv[2]) : int64_t(256) << 20;
  auto store = Store::from_env();
  auto comm = Communicator::gloo(store, rank, n);
  auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::seconds(300));
  opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  opts->threads = 2;
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(c10d_store(*store, "bench_pg"), rank, n, opts);
  const bool c10d_bf16 = c10d_takes(*pg, torch::kBFloat16);
  const std::string sha = tessera::bench::commit();
  for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    const int64_t elements = bytes / 4;
    const int reps = reps_for(bytes);
    for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
      if (!all_reduce_right(*comm, elements, rank, n, dtype)) return std::fprintf(stderr, "all_reduce wrong\n"), 1;
      const bool same = dtype == torch::kFloat || c10d_bf16;
      auto t = torch::ones({elements}, dtype);
      auto t_base = torch::ones({elements}, same ? dtype : torch::kFloat);
      std::vector<at::Tensor> v{t_base};
      Timing timing = time_pair(reps, [&] { comm->all_reduce(t)->wait(); }, [&] { pg->allreduce(v)->wait(); });
      const bool fp32 = dtype == torch::kFloat;
      print(rank, "all_reduce", fp32 ? "fp32" : "bf16", same && !fp32 ? "bf16" : "fp32", bytes, n, 2.0 * (n - 1) / n,
            timing, reps, sha);
    }
    if (elements % n != 0) continue;
    auto in = torch::ones({elements});
    auto out = torch::empty({elements / n});
    auto full = torch::ones({elements});
    std::vector<at::Tensor> v{full};
    Timing timing = time_pair(reps, [&] { comm->reduce_scatter(in, out)->wait(); }, [&] {
      pg->allreduce(v)->wait();
      out.copy_(full.narrow(0, rank * (elements / n), elements / n));
    });
    print(rank, "reduce_scatter", "fp32", "fp32", bytes, n, 1.0 * (n - 1) / n, timing, reps, sha);
  }
  comm->barrier()->wait();
  return 0;
}
