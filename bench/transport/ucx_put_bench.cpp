// UCX put bandwidth between two processes of one job (run it through tessera-launch with
// --nproc-per-node 2; bench/transport/run_ucx_put_bench.py does that and runs ucx_perftest's
// ucp_put_bw on the same sizes in the same run, printing the ratio).
//
// Rank 1 registers a 256 MiB buffer and keeps progressing its worker; rank 0 puts `size` bytes
// `iterations` times back to back into it with put_nowait (pipelined, as ucp_put_bw does), flushes once, and reports
// MB/s (MB = 2^20 bytes, ucx_perftest's unit). Data is validated once before timing.
// Output, one line per size: "ucx_put size=<bytes> iterations=<n> mbps=<MB/s>".
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <ucp/api/ucp.h>

#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_endpoint.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

using namespace tessera::transport;

int main(int argc, char** argv) {
  const int rank = std::atoi(std::getenv("RANK") ? std::getenv("RANK") : "0");
  const size_t max_bytes = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : (256u << 20);
  const auto timeout = std::chrono::seconds(120);
  auto store = Store::from_env();
  UcxContext context({});
  UcxPeers peers(context, store, "bench", rank, 2, "ucx-bench");
  peers.connect("bench");
  auto& peer = peers.endpoint("bench", 1 - rank);
  if (std::getenv("TESSERA_BENCH_PRINT_LANES") && rank == 0) ucp_ep_print_info(peer.handle(), stdout);
  std::vector<uint8_t> buffer(max_bytes);
  for (size_t i = 0; i < max_bytes; ++i) buffer[i] = static_cast<uint8_t>(i * 7 + rank);
  if (rank == 1) {
    // TESSERA_BENCH_USER_MEMORY=1: register the user's buffer instead of a UCX-allocated one.
    std::unique_ptr<UcxMemory> memory = std::getenv("TESSERA_BENCH_USER_MEMORY")
                                            ? std::make_unique<UcxMemory>(context, buffer.data(), max_bytes)
                                            : UcxMemory::allocate(context, max_bytes);
    peers.publish_memory("target", *memory);
    uint8_t done = 0;
    ucx_receive(context, &done, 1, 1, std::chrono::seconds(600));  // progresses while rank 0 puts
    return 0;
  }
  UcxMemory source(context, buffer.data(), max_bytes);  // registered like ucx_perftest's buffers
  const auto& remote = peers.remote_key("bench", 1, "target");
  // Validate: one put of 1 MiB, read back with a get.
  {
    const size_t n = std::min<size_t>(1 << 20, max_bytes);
    peer.put(buffer.data(), n, remote, 0, timeout);
    peer.flush(timeout);
    std::vector<uint8_t> back(n);
    peer.get(back.data(), n, remote, 0, timeout);
    peer.flush(timeout);
    if (std::memcmp(back.data(), buffer.data(), n) != 0) {
      std::fprintf(stderr, "ucx_put: validation failed\n");
      return 1;
    }
  }
  for (size_t size = 4096; size <= max_bytes; size *= 4) {
    const int iterations = static_cast<int>(std::max<size_t>(20, std::min<size_t>(2000, (2048ull << 20) / size)));
    for (int i = 0; i < 3; ++i) peer.put(buffer.data(), size, remote, 0, timeout);  // warm-up
    peer.flush(timeout);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iterations; ++i) peer.put_nowait(buffer.data(), size, remote, 0, timeout);
    peer.flush(timeout);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("ucx_put size=%zu iterations=%d mbps=%.1f\n", size, iterations,
                static_cast<double>(size) * iterations / s / (1 << 20));
    std::fflush(stdout);
  }
  uint8_t done = 1;
  peer.send(&done, 1, 1, timeout);
  return 0;
}
