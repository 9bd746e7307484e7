// Host buffers for large one-shot reads (a checkpoint's source bytes, a staging area): anonymous
// memory aligned to 2 MiB and advised as huge pages, so that the first touch of 1 GiB costs 512
// page faults rather than 262,144. Where transparent huge pages are set to `madvise` (Debian's
// default) plain allocations get 4 KiB pages, and in a virtual machine each fault is expensive:
// loading a checkpoint spent most of its time faulting in the buffers it reads into.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace tessera::io {

// A flat, uninitialised CPU tensor of `numel` elements of `dtype`, freed with munmap when its
// last reference goes. An mmap failure throws tessera::Error naming the size (no silent fallback).
at::Tensor huge_page_empty(int64_t numel, at::ScalarType dtype);

}  // namespace tessera::io
