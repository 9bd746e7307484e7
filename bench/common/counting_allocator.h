// A counting CPU allocator for benchmarks that measure memory: installed with
// c10::SetCPUAllocator(&allocator, 100), every CPU tensor allocation of the process goes through
// it, and g_live / g_peak count the bytes live now and the most since reset_peak().
#pragma once

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <torch/version.h>

#include <atomic>
#include <cstdint>

namespace tessera::bench {

inline std::atomic<int64_t> g_live{0}, g_peak{0};  // bytes live now, and the most since reset_peak()

inline void count_alloc(int64_t n) {
  const int64_t now = g_live.fetch_add(n) + n;
  int64_t peak = g_peak.load();
  while (now > peak && !g_peak.compare_exchange_weak(peak, now)) {
  }
}

// LibTorch's CPU allocation (c10::alloc_cpu, 64-byte aligned) with the size in a 64-byte header
// in front of the data, so the data pointer is its own context, as raw_allocate() requires (the
// kernels that take scratch buffers use it). Storages remember their allocator, so ZeRO-3's
// re-materialised units go through it too.
class CountingAllocator final : public c10::Allocator {
 public:
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
  c10::DataPtr allocate(size_t n) override { return make(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
#else
  c10::DataPtr allocate(size_t n) const override { return make(n); }
#endif
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

 private:
  static constexpr size_t kHeader = 64;
  static void release(void* data) {
    if (!data) return;
    char* base = static_cast<char*>(data) - kHeader;
    g_live.fetch_sub(*reinterpret_cast<int64_t*>(base));
    c10::free_cpu(base);
  }
  static c10::DataPtr make(size_t n) {
    char* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    *reinterpret_cast<int64_t*>(base) = int64_t(n);
    count_alloc(int64_t(n));
    void* data = base + kHeader;
    return c10::DataPtr(data, data, &CountingAllocator::release, c10::Device(c10::kCPU));
  }
};

inline void reset_peak() { g_peak.store(g_live.load()); }

}  // namespace tessera::bench
