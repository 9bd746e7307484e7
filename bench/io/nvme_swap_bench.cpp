// nvme_swap_bench: the NVMe optimizer offload's swap path (optim::NvmeStateStore over
// io::UringFile, io_uring with O_DIRECT) as a ratio to raw O_DIRECT sequential I/O of the same
// bytes in the same directory, measured in the same run.
//   build/bench/io/nvme_swap_bench [--dir /tmp] [--states-mib 1024] [--sub-group 1000000] [--buffers 4]
//
// A store of AdamW sub-groups (fp32 master, exp_avg, exp_avg_sq: 12 bytes per element) several
// times its buffers; a sweep is what one optimizer step does to it without the arithmetic: every
// sub-group acquired (read ahead into a free buffer) and released (written back behind), then
// flushed. ratio_to_raw = (raw write + raw read of the file's bytes) / sweep time: 1 means the swap
// path moves bytes as fast as the disk does one request after another. One line per aio setting
// (block_size, queue_depth, threads), medians of --sweeps sweeps; peak RSS (the fill's sub-group
// temporaries included) against the buffers and the RSS before the store.
// fsyncs: 0 on both sides (a swap file need not survive a crash).
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
#include "core/optim/nvme_state_store.h"

namespace {

using tessera::bench::median;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"NVMe offload's swap path against raw O_DIRECT sequential I/O"};
  std::string dir = "/tmp";
  int64_t states_mib = 1024, sub_group = 1'000'000, buffers = 4;
  int sweeps = 3;
  app.add_option("--dir", dir, "directory of the swap file and the baseline's file");
  app.add_option("--states-mib", states_mib, "master and optimizer states in the swap file, MiB");
  app.add_option("--sub-group", sub_group, "elements per sub-group (12 bytes each)");
  app.add_option("--buffers", buffers, "sub-group records in host memory");
  app.add_option("--sweeps", sweeps, "sweeps per aio setting");
  CLI11_PARSE(app, argc, argv);

  const double rss_before = tessera::bench::status_mib("VmRSS");
  const int64_t elements = states_mib * (1 << 20) / 12;
  tessera::optim::NvmeStateStore::Group group;
  group.master_dtype = at::kFloat;
  group.state_dtypes = {at::kFloat, at::kFloat};
  for (int64_t b = 0; b < elements; b += sub_group) group.sub_groups.emplace_back(b, std::min(elements, b + sub_group));
  auto fill = [&](int64_t, int64_t s) {
    const auto [b, e] = group.sub_groups[size_t(s)];
    tessera::optim::SubGroupState st;
    st.master = at::full({e - b}, 0.5f);
    st.states = {at::zeros({e - b}), at::zeros({e - b})};
    return st;
  };
  struct Setting { int64_t block, depth, threads; };
  const Setting settings[] = {{1 << 20, 8, 1}, {1 << 20, 8, 2}, {4 << 20, 16, 1}, {4 << 20, 16, 2}};
  for (const auto& setting : settings) {
    tessera::optim::NvmeStoreOptions options;
    options.path = dir + "/nvme_swap_bench.swap";
    options.buffers = buffers;
    options.aio.block_size = setting.block, options.aio.queue_depth = setting.depth, options.aio.threads = setting.threads;
    const auto t_fill = std::chrono::steady_clock::now();
    tessera::optim::NvmeStateStore store({group}, fill, options);
    const double fill_s = tessera::seconds_since(t_fill);
    const int64_t bytes = store.file_bytes();
    std::vector<double> sweep_s, raw_s, raw_read, raw_write;
    for (int k = 0; k < sweeps; ++k) {
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t s = 0; s < int64_t(group.sub_groups.size()); ++s) {
        store.acquire(0, s);
        store.release(0, s);
      }
      store.flush();
      sweep_s.push_back(tessera::seconds_since(t0));
      // The baseline beside it, so that both see the disk in the same state.
      const auto raw = tessera::bench::raw_direct_io(dir + "/nvme_swap_bench.raw", bytes, setting.block);
      raw_s.push_back(raw.write_s + raw.read_s);
      raw_read.push_back(raw.read_gbps()), raw_write.push_back(raw.write_gbps());
    }
    std::vector<double> ratios;
    for (size_t k = 0; k < sweep_s.size(); ++k) ratios.push_back(raw_s[k] / sweep_s[k]);
    const auto stats = store.stats();
    std::printf("{\"bench\":\"nvme_swap\",\"dir\":\"%s\",\"states_mib\":%.1f,\"sub_groups\":%zu,\"buffers\":%lld,"
                "\"block_size\":%lld,\"queue_depth\":%lld,\"threads\":%lld,\"sweeps\":%d,"
                "\"fill_gbps\":%.3f,\"sweep_gbps\":%.3f,\"raw_read_gbps\":%.3f,\"raw_write_gbps\":%.3f,"
                "\"ratio_to_raw\":%.3f,\"prefetched\":%lld,\"waited_reads\":%lld,\"fsyncs\":%lld,"
                "\"buffer_mb\":%.1f,\"rss_before_mb\":%.1f,\"peak_rss_mb\":%.1f}\n",
                dir.c_str(), double(bytes) / (1 << 20), group.sub_groups.size(), static_cast<long long>(buffers),
                static_cast<long long>(setting.block), static_cast<long long>(setting.depth),
                static_cast<long long>(setting.threads), sweeps, double(bytes) / fill_s / 1e9,
                2.0 * double(bytes) / median(sweep_s) / 1e9, median(raw_read), median(raw_write), median(ratios),
                static_cast<long long>(stats.prefetched), static_cast<long long>(stats.waited_reads),
                static_cast<long long>(stats.io.fsyncs), double(store.buffer_bytes()) / (1 << 20), rss_before,
                tessera::bench::status_mib("VmHWM"));
    std::fflush(stdout);
  }
  return 0;
}
