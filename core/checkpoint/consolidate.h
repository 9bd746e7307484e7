// consolidate(): the fp32 weights of a checkpoint saved at any layout, whole, under the model's
// parameter names, in files any Hugging Face or PyTorch reader takes (`tessera checkpoint
// consolidate`; DeepSpeed's zero_to_fp32). No engine, no config, no ranks: the manifest's maps say
// where every piece lies.
//
// What is written: the "master" kind (the optimizer's fp32 copy; with fp32 training its maps point
// into the weights), else the weights when they are fp32; a checkpoint with neither is refused.
// Frozen parameters follow in their saved dtype, as zero_to_fp32 writes them (unless
// exclude_frozen_parameters).
// OUT is a new directory (or an empty one) holding
//   safetensors: model.safetensors, or model-0000i-of-0000N.safetensors + model.safetensors.index.json
//   pytorch_bin: pytorch_model.bin, or pytorch_model-0000i-of-0000N.bin + pytorch_model.bin.index.json
// sharded above max_shard_bytes as transformers does (hf_shards.h).
//
// Streaming: tensor by tensor, each planned from its map into one contiguous buffer, read from the
// rank files with positional reads of the chunks it touches, every chunk verified against its
// XXH3, written, and the buffer reused: peak memory is the largest tensor plus one 4 MiB read
// buffer (plus the manifest), whatever the model's size.
// Atomic: everything is checked first (the manifest, each file's size, each tensor's map), then
// written into DIR_OF_OUT/.<name>.partial-<pid>/ and renamed to OUT at the end; on any error
// (a corrupted chunk names its file and tensor) that directory is removed and OUT never appears
// (a kill -9 leaves only that hidden directory).
//
// Example: a stage-3 checkpoint of 2 ranks, 8 tensors of 32 MiB: model.safetensors of 256 MiB,
// read in 4 MiB chunks, with ~36 MiB peak memory for the tensors.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::checkpoint {

enum class ConsolidateFormat { safetensors, pytorch_bin };

inline constexpr int64_t kDefaultMaxShardBytes = 5'000'000'000;  // transformers' "5GB"

struct ConsolidateOptions {
  std::string tag;  // empty: DIR is a tag directory, or a root whose `latest` names the tag
  ConsolidateFormat format = ConsolidateFormat::safetensors;
  int64_t max_shard_bytes = kDefaultMaxShardBytes;
  bool exclude_frozen_parameters = false;  // DeepSpeed's zero_to_fp32 option of that name
};

struct ConsolidateReport {
  std::string tag_dir;              // what was read
  std::string out_dir;
  std::string kind;                 // "master" or "param"
  std::vector<std::string> files;   // written into out_dir, the index last
  int64_t tensors = 0;              // written, frozen ones included
  int64_t frozen = 0;               // frozen parameters among them
  int64_t tensor_bytes = 0;         // of all tensors written
  int64_t largest_tensor_bytes = 0;
  int64_t bytes_read = 0;           // from the rank files (edge chunks count twice)
};

ConsolidateReport consolidate(const std::string& dir, const std::string& out, const ConsolidateOptions& options = {});

ConsolidateFormat parse_consolidate_format(const std::string& name);  // "safetensors" | "bin"

}  // namespace tessera::checkpoint
