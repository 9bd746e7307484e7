#include "core/checkpoint/rank_file_writer.h"

#include <algorithm>
#include <filesystem>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/tensor_file_writer.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {
RankFile write_rank_file(const std::string& path, int rank, const std::vector<RankFileBuffer>& buffers,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<OutputTensor> tensors;
  for (const auto& b : buffers) {
    const int64_t element = affine::element_size(b.dtype);
    if (b.bytes < 0 || b.bytes % element != 0 || (b.bytes > 0 && b.data == nullptr))
      throw CheckpointError(path + ": buffer '" + b.key + "' is " + std::to_string(b.bytes) +
                            " bytes, not a whole number of " + affine::dtype_name(b.dtype) + " elements");
    tensors.push_back({b.key, b.dtype, affine::Dims{b.bytes / element}});
  }
  auto header_metadata = metadata;
  header_metadata["format"] = "tessera.checkpoint.rank";
  header_metadata["rank"] = std::to_string(rank);
  const auto prefix = safetensors_prefix(tensors, header_metadata);

  OutputFile file(path);
  StreamHash file_hash;
  file.write(prefix.data(), prefix.size());
  file_hash.update(prefix.data(), prefix.size());
  RankFile entry;
  entry.rank = rank;
  entry.file = fs::path(path).filename().string();
  for (size_t i = 0; i < buffers.size(); ++i) {
    const auto& b = buffers[i];
    SavedBuffer saved;
    saved.key = b.key, saved.dtype = b.dtype, saved.elements = tensors[i].shape.product();
    saved.data_offset = file.written(), saved.chunk_bytes = kChunkBytes;
    const auto* bytes = static_cast<const char*>(b.data);
    for (int64_t at = 0; at < b.bytes; at += kChunkBytes) {
      const auto n = std::min(kChunkBytes, b.bytes - at);
      file.write(bytes + at, size_t(n));
      saved.chunk_hashes.push_back(xxh3(bytes + at, size_t(n)));  // the chunk, still in cache
      file_hash.update(bytes + at, size_t(n));
    }
    entry.buffers.push_back(std::move(saved));
  }
  file.sync_and_close();
  entry.bytes = file.written();
  entry.hash = file_hash.digest();
  return entry;
}

}  // namespace tessera::checkpoint
