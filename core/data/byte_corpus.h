// A ByteCorpus is a text corpus as one byte sequence, cut into training batches of (tokens,
// next-token targets) that are a pure function of (seed, step, micro-step): every rank, and a
// single-process oracle run, can compute any batch without communication.
//
// Sharding contract: the global batch of a micro-step holds `global_batch` sequences; data-
// parallel rank r of W takes sequences [r * global_batch / W, (r + 1) * global_batch / W). So the
// concatenation of all ranks' micro-batches is exactly the single-process global batch.
//
// Example: the default corpus is /usr/share/common-licenses/* (Debian's base-files, about 260 KB
// of English); at context 128, a global batch of 16 draws 16 windows of 129 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

namespace tessera::data {

struct TokenBatch {
  at::Tensor tokens;   // [B, T] int64
  at::Tensor targets;  // [B, T] int64, tokens shifted by one
};

class ByteCorpus {
 public:
  // Reads and concatenates `paths` (a directory reads its regular files in sorted order).
  // Throws tessera::Error naming the path when one cannot be read or all are empty.
  explicit ByteCorpus(const std::vector<std::string>& paths);

  // The files shipped with every Debian system (base-files).
  static std::vector<std::string> default_paths() { return {"/usr/share/common-licenses"}; }

  int64_t size_bytes() const { return int64_t(bytes_.size()); }

  // Rank `rank` of `world`'s share of micro-step (step, micro) of `global_batch` windows of
  // `context` tokens. Throws if global_batch is not divisible by world or the corpus is too short.
  TokenBatch batch(uint64_t seed, int64_t step, int64_t micro, int64_t global_batch, int64_t context,
                   int64_t rank = 0, int64_t world = 1) const;

 private:
  std::vector<uint8_t> bytes_;
};

}  // namespace tessera::data
