#include "core/io/huge_page_buffer.h"

#include <ATen/ATen.h>
#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tessera::io {
namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}

at::Tensor huge_page_empty(int64_t numel, at::ScalarType dtype) {
  const size_t bytes = size_t(numel) * c10::elementSize(dtype);
  if (bytes == 0) return at::empty({numel}, at::TensorOptions().dtype(dtype));
  // Over-allocate one huge page and trim both ends, so that the kept range starts on a 2 MiB
  // boundary (mmap guarantees only 4 KiB).
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
  void* raw = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    throw Error("huge_page_empty: mmap of " + std::to_string(mapped) + " bytes failed: " + std::strerror(errno));
  auto* start = static_cast<char*>(raw);
  auto* aligned = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(start) + kHugePage - 1) & ~(kHugePage - 1));
  const size_t keep = mapped - kHugePage;
  if (aligned > start) ::munmap(start, size_t(aligned - start));
  if (char* end = start + mapped; aligned + keep < end) ::munmap(aligned + keep, size_t(end - (aligned + keep)));
  ::madvise(aligned, keep, MADV_HUGEPAGE);  // advice only: without THP the pages are small, still correct
  return at::from_blob(
      aligned, {numel}, [keep](void* p) { ::munmap(p, keep); }, at::TensorOptions().dtype(dtype));
}

}  // namespace tessera::io
