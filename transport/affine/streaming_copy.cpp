#include "transport/affine/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) || defined(__SSE2__)
#include <emmintrin.h>
#define TESSERA_STREAMING_STORES 1
#endif

namespace tessera::transport {

void streaming_copy(void* dst, const void* src, size_t bytes) {
#ifdef TESSERA_STREAMING_STORES
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  if (bytes < 256) return void(std::memcpy(d, s, bytes));  // not worth the fence it needs
  // Up to the destination's next 16-byte boundary with memcpy, then 64 bytes (a line) per step.
  const size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head, s += head, bytes -= head;
  for (; bytes >= 64; bytes -= 64, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, bytes);
#else
  std::memcpy(dst, src, bytes);
#endif
}

void streaming_fence() {
#ifdef TESSERA_STREAMING_STORES
  _mm_sfence();
#endif
}

}  // namespace tessera::transport
