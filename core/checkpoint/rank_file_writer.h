// write_rank_file: one checkpoint rank file (safetensors: the header, then each buffer's bytes in
// order) and its manifest entry, shared by the engine's save and the DeepSpeed import.
//
// One pass over memory: each 4 MiB chunk is written (copied into the page cache) and then hashed
// while it is still in the CPU's cache; one fsync at the end. Starting the writeback early
// (sync_file_range every 64 MiB) was tried and measured slower on this machine's virtual disk
// (0.69 of a raw write + fsync against 0.89 without, alternating pairs). A plain write + fsync of
// the same bytes is bench/checkpoint's baseline. The file is created new (O_EXCL) and synced; on an
// error (CheckpointError naming the file and buffer) the caller removes it with its partial directory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/dtype.h"
#include "core/checkpoint/manifest.h"

namespace tessera::checkpoint {

struct RankFileBuffer {
  std::string key;  // "<kind>/<group>"
  affine::DType dtype = affine::DType::f32;
  const void* data = nullptr;
  int64_t bytes = 0;  // a whole number of elements
};

// `metadata` goes into the header's __metadata__ next to {"format": "tessera.checkpoint.rank", "rank": r}.
RankFile write_rank_file(const std::string& path, int rank, const std::vector<RankFileBuffer>& buffers,
                         const std::map<std::string, std::string>& metadata = {});

}  // namespace tessera::checkpoint
