// Fnv64: an FNV-1a-style 64-bit hash over 64-bit words (xor a word, multiply by the FNV prime, fold
// the high half back in), used for plan and input digests. Not cryptographic: it detects processes
// that planned different inputs, not adversaries. Platform independent (integers are hashed as
// values; strings byte by byte).
#pragma once

#include <cstdint>
#include <string>

#include "core/affine/box.h"

namespace tessera::affine::detail {

class Fnv64 {
 public:
  void add(uint64_t value) {
    h_ ^= value;
    h_ *= 1099511628211ull;
    h_ ^= h_ >> 29;
  }
  void add_signed(int64_t value) { add(static_cast<uint64_t>(value)); }
  void add(const std::string& text) {
    add(static_cast<uint64_t>(text.size()));
    for (char ch : text) byte(static_cast<uint8_t>(ch));
  }
  void add(const Dims& dims) {
    add(static_cast<uint64_t>(dims.size()));
    for (int64_t v : dims) add_signed(v);
  }
  uint64_t value() const { return h_; }

 private:
  void byte(uint8_t b) {
    h_ ^= b;
    h_ *= 1099511628211ull;
  }
  uint64_t h_ = 14695981039346656037ull;
};

}  // namespace tessera::affine::detail
