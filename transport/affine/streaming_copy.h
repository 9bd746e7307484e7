// streaming_copy: a memcpy whose stores bypass the caches (x86 non-temporal stores), for the remote
// executor's copies into a peer's mapped memory when a batch moves more than the caches hold. A
// plain copy reads each destination line in before writing it (write-allocate) and evicts useful
// lines; a streaming one writes lines whole, so copying a rows -> columns resharding row by row ran
// 8 -> 13 GB/s here. Small syncs keep memcpy: their target reads the bytes back (to hash them)
// while they may still be in the last-level cache.
//
// The stores are weakly ordered: streaming_fence() after the last copy, before anything tells the
// target the bytes are there. Elsewhere than x86-64 both are memcpy and a no-op.
#pragma once

#include <cstddef>

namespace tessera::transport {

void streaming_copy(void* dst, const void* src, size_t bytes);
void streaming_fence();

}  // namespace tessera::transport
