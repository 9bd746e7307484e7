// parameter_swap_bench: parameters on NVMe (zero::ParameterSwap over io::UringFile, io_uring with
// O_DIRECT) as a ratio to raw O_DIRECT sequential I/O of the same bytes in the same directory,
// measured in the same run.
//   build/bench/io/parameter_swap_bench [--dir /tmp] [--mib 512] [--unit-mib 4] [--chunk-mib 8] [--buffers 4]
//
// One bf16 partition several times the buffers. A gather pass is what a forward asks of it: every
// unit's range read in order, the next unit's read ahead first (prefetch) as the gather schedule
// does. An update pass is what the optimizer does: every sub-group's range written in order (each
// chunk written behind as the writer passes its end), then flushed. read_ratio_to_raw = raw read
// time / gather pass time, write_ratio_to_raw = raw write time / update pass time: 1 means the swap
// moves bytes as fast as the disk does one request after another. One line per aio setting,
// medians of --passes passes; peak RSS against the buffers. fsyncs: 0 on both sides.
#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/common/direct_io.h"
#include "bench/common/median.h"
#include "bench/common/process_memory.h"
#include "core/elapsed.h"
#include "core/zero/parameter_swap.h"

namespace {

using tessera::bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVMe parameter offload's swap against raw O_DIRECT sequential I/O"};
  std::string dir = "/tmp";
  int64_t mib = 512, unit_mib = 4, chunk_mib = 8, buffers = 4;
  int passes = 3;
  app.add_option("--dir", dir, "directory of the swap file and the baseline's file");
  app.add_option("--mib", mib, "the bf16 partition in the swap file, MiB");
  app.add_option("--unit-mib", unit_mib, "bytes per unit read (gather) and per sub-group written (update), MiB");
  app.add_option("--chunk-mib", chunk_mib, "the swap's chunk (buffer_size), MiB");
  app.add_option("--buffers", buffers, "chunks in host memory (buffer_count)");
  app.add_option("--passes", passes, "passes per aio setting");
  CLI11_PARSE(app, argc, argv);

  const double rss_before = tessera::bench::status_mib("VmRSS");
  const int64_t elements = mib * (1 << 20) / 2, unit = unit_mib * (1 << 20) / 2;
  const auto values = at::full({unit}, 0.5, at::kBFloat16);
  auto dst = at::empty({unit}, at::kBFloat16);
  struct Setting { int64_t block, depth, threads; };
  const Setting settings[] = {{1 << 20, 8, 1}, {1 << 20, 8, 2}, {4 << 20, 16, 1}, {4 << 20, 16, 2}};
  for (const auto& setting : settings) {
    tessera::zero::ParameterSwapOptions options;
    options.path = dir + "/parameter_swap_bench.swap";
    options.chunk_bytes = chunk_mib << 20, options.buffers = buffers;
    options.aio.block_size = setting.block, options.aio.queue_depth = setting.depth, options.aio.threads = setting.threads;
    tessera::zero::ParameterSwap swap({{at::kBFloat16, elements}}, options);
    auto update_pass = [&] {
      for (int64_t b = 0; b < elements; b += unit) swap.write(0, b, values.narrow(0, 0, std::min(unit, elements - b)));
      swap.flush();
    };
    auto gather_pass = [&] {
      for (int64_t b = 0; b < elements; b += unit) {
        if (b + unit < elements) swap.prefetch(0, b + unit, std::min(unit, elements - b - unit));
        swap.read(0, b, dst.narrow(0, 0, std::min(unit, elements - b)));
      }
    };
    update_pass();  // the first write fills the file
    const int64_t bytes = elements * 2;
    std::vector<double> gather_s, update_s, raw_read_s, raw_write_s;
    for (int k = 0; k < passes; ++k) {
      auto t0 = std::chrono::steady_clock::now();
      gather_pass();
      gather_s.push_back(tessera::seconds_since(t0));
      t0 = std::chrono::steady_clock::now();
      update_pass();
      update_s.push_back(tessera::seconds_since(t0));
      const auto raw = tessera::bench::raw_direct_io(dir + "/parameter_swap_bench.raw", bytes, setting.block);
      raw_read_s.push_back(raw.read_s), raw_write_s.push_back(raw.write_s);
    }
    std::vector<double> read_ratio, write_ratio;
    for (size_t k = 0; k < gather_s.size(); ++k) {
      read_ratio.push_back(raw_read_s[k] / gather_s[k]);
      write_ratio.push_back(raw_write_s[k] / update_s[k]);
    }
    const auto stats = swap.stats();
    std::printf("{\"bench\":\"parameter_swap\",\"dir\":\"%s\",\"partition_mib\":%lld,\"unit_mib\":%lld,"
                "\"chunk_mib\":%lld,\"buffers\":%lld,\"block_size\":%lld,\"queue_depth\":%lld,\"threads\":%lld,"
                "\"passes\":%d,\"gather_gbps\":%.3f,\"update_gbps\":%.3f,\"raw_read_gbps\":%.3f,"
                "\"raw_write_gbps\":%.3f,\"read_ratio_to_raw\":%.3f,\"write_ratio_to_raw\":%.3f,\"hits\":%lld,"
                "\"misses\":%lld,\"fsyncs\":%lld,\"buffer_mb\":%.1f,\"rss_before_mb\":%.1f,\"peak_rss_mb\":%.1f}\n",
                dir.c_str(), static_cast<long long>(mib), static_cast<long long>(unit_mib),
                static_cast<long long>(chunk_mib), static_cast<long long>(buffers),
                static_cast<long long>(setting.block), static_cast<long long>(setting.depth),
                static_cast<long long>(setting.threads), passes, double(bytes) / median(gather_s) / 1e9,
                double(bytes) / median(update_s) / 1e9, double(bytes) / median(raw_read_s) / 1e9,
                double(bytes) / median(raw_write_s) / 1e9, median(read_ratio), median(write_ratio),
                static_cast<long long>(stats.hits), static_cast<long long>(stats.misses),
                static_cast<long long>(stats.io.fsyncs), double(swap.buffer_bytes()) / (1 << 20), rss_before,
                tessera::bench::status_mib("VmHWM"));
    std::fflush(stdout);
  }
  return 0;
}
