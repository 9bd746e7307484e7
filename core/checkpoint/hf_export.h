// The 16-bit export (Engine::save_16bit_model, DeepSpeed's save_16bit_model): the weights whole, in
// their training dtype, as a Hugging Face safetensors directory, written by every rank straight
// from the pieces it stores (no gather of the model to one rank, at any stage). LibTorch-free: this
// file decides the files' layout and which bytes each rank writes; the engine moves them.
//
// Layout: the tensors in model order, sharded as transformers shards (hf_shards.h); each file's
// header is known before any data exists, so every tensor's absolute byte offset is too.
// Who writes what: a piece held by one rank is written by it; a replicated piece (the weights at
// stages 0-2, ZeRO-3's persistent weights) is written once. Each file's data section is cut into
// `world` slices at 4 KiB boundaries; a replicated byte in slice k is written by rank k when it
// holds it (at stages 0-2 every rank does, so each writes its share of every file), else by the
// holder k mod |holders|.
//
// Example: stage 1, 2 ranks, one bf16 tensor of 8 MiB in model.safetensors: rank 0 writes the
// first 4 MiB of the data section (to a 4 KiB edge), rank 1 the rest; at stage 3 each rank writes
// the elements of its partition, wherever they lie.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/checkpoint/tensor_file_writer.h"

namespace tessera::checkpoint {

struct ExportFile {
  std::string name;         // in the output directory
  std::string prefix;       // its first bytes: length and header (safetensors_prefix)
  int64_t bytes = 0;        // the whole file
};

struct ExportLayout {
  std::vector<ExportFile> files;
  std::vector<int> file_of;            // per tensor, in the order given
  std::vector<int64_t> offset_of;      // per tensor: byte offset of its first element in its file
  std::string index_name, index_json;  // empty when there is one file
};

// `metadata` goes in every file's "__metadata__" (Hugging Face wants {"format": "pt"}).
ExportLayout plan_export(const std::vector<OutputTensor>& tensors, int64_t max_shard_bytes,
                         const std::map<std::string, std::string>& metadata);

// One pwrite: `bytes` bytes from `buffer_offset` (bytes) of the rank's buffer to `file_offset`.
struct ExportWrite {
  int file = 0;
  int64_t file_offset = 0;
  int64_t buffer_offset = 0;
  int64_t bytes = 0;
};

// The writes `rank` (of `world`) makes for `map` (its pieces' addresses in the rank's buffer) of a
// tensor at byte `tensor_offset` of file `file`, stored row-major there. Adjacent runs are merged.
std::vector<ExportWrite> export_writes(const affine::TensorMap& map, const ExportLayout& layout, int file,
                                       int64_t tensor_offset, int rank, int world);

// What a new export file's data section holds before the ranks write it.
enum class ExportFill : uint8_t {
  sparse,     // nothing written (reads as zeros): the normal case, no extra pass over the disk
  nan_bytes,  // 0xFF bytes, NaN in every float dtype: an unwritten byte shows in a test
};

// Creates `path` new (O_EXCL) holding `file`'s prefix, sized to file.bytes, synced.
void create_export_file(const std::string& path, const ExportFile& file, ExportFill fill);

// An existing file written at given offsets by one rank (EINTR and short writes retried), then
// synced. CheckpointError naming the file.
class PositionalWriter {
 public:
  explicit PositionalWriter(std::string path);
  ~PositionalWriter();
  PositionalWriter(const PositionalWriter&) = delete;
  PositionalWriter& operator=(const PositionalWriter&) = delete;
  void write_at(const void* data, int64_t bytes, int64_t offset);
  void sync_and_close();

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tessera::checkpoint
