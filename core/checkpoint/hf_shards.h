// Hugging Face's sharded weight layout: tensors, in order, cut into files of at most
// max_shard_bytes each (a tensor larger than that alone in its file), named
// "<stem>-00001-of-00003.<ext>", with "<stem>.<ext>.index.json" = {"metadata": {"total_size": T},
// "weight_map": {name: file}}; one file alone is plainly "<stem>.<ext>" and has no index. This is
// transformers' own rule (shard_checkpoint: a new shard when the next tensor would not fit).
//
// Example: tensors of 40, 30, 50 and 10 bytes at max 64: files [40], [30], [50, 10] ->
// model-00001-of-00003.safetensors ... with total_size 130.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::checkpoint {

struct ShardFile {
  std::string file;             // its name in the output directory
  std::vector<size_t> tensors;  // indices into the tensor list, in order
  int64_t bytes = 0;            // of tensor data
};

std::vector<ShardFile> plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes,
                                   const std::string& stem, const std::string& ext);
// The index's name ("model.safetensors.index.json") and its JSON text (names in tensor order).
std::string shard_index_name(const std::string& stem, const std::string& ext);
std::string shard_index_json(const std::vector<ShardFile>& shards, const std::vector<std::string>& names,
                             int64_t total_size);

}  // namespace tessera::checkpoint
