// What verifying and delta-packing a sync costs next to moving its bytes, with Google Benchmark:
// one training rank's share of a (4096, 4096) tensor, rows on 2 ranks -> columns on 4 (the
// resharding the weight sync does), in bf16 and fp32, 32-64 MiB so no buffer stays in the caches.
//   memcpy          the rank's bytes copied whole: the baseline
//   local_execute   the same bytes moved by core/affine's local executor into the 4 column shards
//   segment_digest  XXH3 over the rank's segments in plan order (what each end of a sync hashes)
//   delta_pack      append_delta for the 4 targets with 2% or all elements changed
//   delta_apply     apply_delta of those packets onto the targets' last version
// Then one JSON line per benchmark with its bytes/s and the ratio to memcpy of the same dtype,
// measured in the same run. Usage: verify_bench [--benchmark_min_time=0.5 ...] (Google Benchmark's flags).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/affine/builders.h"
#include "core/affine/delta_packet.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/affine/segment_digest.h"

namespace {

using namespace tessera::affine;

constexpr int64_t kRows = 4096, kCols = 4096, kSources = 2, kTargets = 4;

// Source rank 0's buffer (now and at the last sync, `changed` of its elements flipped) and the plan.
struct Setup {
  explicit Setup(DType dtype, double changed = 0.0) : dtype(dtype), es(element_size(dtype)) {
    const TensorInfo info{"w", dtype, {kRows, kCols}};
    plan = tessera::affine::plan(contiguous_split(info, 1, even_split_sizes(kCols, kTargets)),
                                 contiguous_split(info, 0, even_split_sizes(kRows, kSources)));
    const int64_t elements = kRows / kSources * kCols;
    last.resize(size_t(elements * es));
    std::mt19937_64 rng(5);
    for (size_t i = 0; i + 8 <= last.size(); i += 8) {
      const uint64_t word = rng();
      std::memcpy(last.data() + i, &word, 8);
    }
    current = last;
    std::bernoulli_distribution flip(changed);
    for (int64_t e = 0; e < elements; ++e)
      if (changed >= 1.0 || flip(rng)) current[size_t(e * es)] ^= 1;
    for (int t = 0; t < kTargets; ++t) targets.emplace_back(size_t(kRows * kCols / kTargets * es));
  }
  LocalBuffer source(std::vector<uint8_t>& b) const { return {b.data(), int64_t(b.size()) / es, dtype}; }
  LocalBuffer target(int t) { return {targets[size_t(t)].data(), int64_t(targets[size_t(t)].size()) / es, dtype}; }
  int64_t bytes() const { return int64_t(current.size()); }

  DType dtype;
  int64_t es;
  Plan plan;
  std::vector<uint8_t> last, current;
  std::vector<std::vector<uint8_t>> targets;
};

DType dtype_of(int64_t arg) { return arg == 2 ? DType::bf16 : DType::f32; }

void memcpy_baseline(benchmark::State& state) {
  Setup s(dtype_of(state.range(0)));
  std::vector<uint8_t> out(s.current.size());
  for (auto _ : state) {
    std::memcpy(out.data(), s.current.data(), s.current.size());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
}

void local_execute(benchmark::State& state) {
  Setup s(dtype_of(state.range(0)));
  // Only rank 0's segments: the other source rank's are another process's work.
  Plan mine = s.plan;
  mine.segments.clear();
  for (const auto& seg : s.plan.segments)
    if (seg.source_rank == 0) mine.segments.push_back(seg);
  LocalTransfer t;
  t.plan = &mine;
  t.source_buffers[0] = s.source(s.current);
  for (int r = 0; r < kTargets; ++r) t.target_buffers[r] = s.target(r);
  for (auto _ : state) {
    execute_local({t});
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
}

void segment_digest(benchmark::State& state) {
  Setup s(dtype_of(state.range(0)));
  const std::map<int, LocalBuffer> buffers{{0, s.source(s.current)}};
  for (auto _ : state) benchmark::DoNotOptimize(segment_digests(s.plan, buffers, true));
  state.SetBytesProcessed(state.iterations() * s.bytes());
}

void delta_pack(benchmark::State& state) {
  Setup s(dtype_of(state.range(0)), double(state.range(1)) / 100.0);
  std::vector<std::vector<uint8_t>> packets(kTargets);
  int64_t packet_bytes = 0;
  for (auto _ : state) {
    packet_bytes = 0;
    for (int t = 0; t < kTargets; ++t) {
      packets[size_t(t)].clear();
      DeltaPacketStats stats;
      append_delta(s.plan, 0, t, s.source(s.current), s.source(s.last), packets[size_t(t)], stats);
      packet_bytes += stats.bytes;
    }
    benchmark::DoNotOptimize(packets.data());
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
  state.counters["packet_to_full"] = double(packet_bytes) / double(s.bytes());
}

void delta_apply(benchmark::State& state) {
  Setup s(dtype_of(state.range(0)), double(state.range(1)) / 100.0);
  std::vector<std::vector<uint8_t>> packets(kTargets);
  for (int t = 0; t < kTargets; ++t) {
    DeltaPacketStats stats;
    append_delta(s.plan, 0, t, s.source(s.current), s.source(s.last), packets[size_t(t)], stats);
  }
  for (auto _ : state) {
    for (int t = 0; t < kTargets; ++t)
      apply_delta(s.plan, 0, t, packets[size_t(t)].data(), packets[size_t(t)].size(), 0, s.target(t));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * s.bytes());
}

// Google Benchmark's console table, then one JSON line per benchmark with its ratio to memcpy.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      Result r;
      r.name = run.benchmark_name();
      const auto bytes = run.counters.find("bytes_per_second");
      r.bytes_per_s = bytes == run.counters.end() ? 0 : double(bytes->second);
      const auto packet = run.counters.find("packet_to_full");
      r.packet_to_full = packet == run.counters.end() ? -1 : double(packet->second);
      results_.push_back(r);
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    std::map<std::string, double> memcpy_rate;  // by the dtype argument ("/2" or "/4")
    for (const auto& r : results_)
      if (r.name.rfind("memcpy_baseline/", 0) == 0) memcpy_rate[r.name.substr(r.name.find('/') + 1, 1)] = r.bytes_per_s;
    for (const auto& r : results_) {
      const auto slash = r.name.find('/');
      const std::string es = slash == std::string::npos ? "" : r.name.substr(slash + 1, 1);
      const double base = memcpy_rate.count(es) ? memcpy_rate[es] : 0;
      std::printf("{\"bench\":\"verify_delta\",\"name\":\"%s\",\"dtype\":\"%s\",\"GiB_s\":%.3f,\"ratio_to_memcpy\":%.3f",
                  r.name.c_str(), es == "2" ? "bf16" : "f32", r.bytes_per_s / double(1 << 30),
                  base > 0 ? r.bytes_per_s / base : 0.0);
      if (r.packet_to_full >= 0) std::printf(",\"packet_to_full\":%.4f", r.packet_to_full);
      std::printf("}\n");
    }
  }

 private:
  struct Result {
    std::string name;
    double bytes_per_s = 0, packet_to_full = -1;
  };
  std::vector<Result> results_;
};

}  // namespace

// Arguments: element size (2: bf16, 4: fp32), then for the delta benchmarks the percent changed.
BENCHMARK(memcpy_baseline)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(local_execute)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(segment_digest)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond);
BENCHMARK(delta_pack)->Args({2, 2})->Args({2, 100})->Args({4, 2})->Args({4, 100})->Unit(benchmark::kMillisecond);
BENCHMARK(delta_apply)->Args({2, 2})->Args({2, 100})->Args({4, 2})->Args({4, 100})->Unit(benchmark::kMillisecond);

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
