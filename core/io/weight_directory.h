// A WeightDirectory is a Hugging Face weight directory read as one name -> tensor table: either
// dir/model.safetensors, or dir/model.safetensors.index.json with the shards it lists.
//
// The index is {"metadata": {"total_size": N}, "weight_map": {"h.0.attn.c_attn.weight":
// "model-00001-of-00002.safetensors", ...}}. Opening validates it all before any tensor is read:
// every shard is a plain file name inside dir (no "/", no ".."), exists and is a valid safetensors
// file; every listed tensor is in its shard; no tensor is in two shards and no shard holds a tensor
// the index does not list. total_size is type-checked only (writers disagree on what it counts).
// When both model.safetensors and the index exist, model.safetensors wins (as in transformers).
//
// Example: save_weight_directory(dir, 3 tensors of 40, 40 and 100 bytes, max_shard_bytes = 64)
// writes model-00001-of-00003.safetensors ... model-00003-of-00003.safetensors (one tensor each:
// 40 + 40 > 64) and the index, total_size 180.
//
// Ownership: immutable after construction; copies share the open shard files. Errors are
// tessera::CheckpointError naming the index file, the shard and the tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/io/safetensors.h"

namespace tessera::io {

class WeightDirectory {
 public:
  explicit WeightDirectory(std::string dir);

  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const StTensorInfo& info(const std::string& name) const;
  at::Tensor read(const std::string& name) const;
  void read_into(const std::string& name, at::Tensor destination) const;  // as SafetensorsFile::read_into
  const std::string& dir() const { return dir_; }
  const std::vector<std::shared_ptr<const SafetensorsFile>>& files() const { return files_; }

 private:
  const SafetensorsFile& file_of(const std::string& name) const;

  std::string dir_;
  std::vector<std::shared_ptr<const SafetensorsFile>> files_;
  std::map<std::string, size_t> where_;  // tensor name -> position in files_
};

// Whether `name` is a file of a Hugging Face weight directory: model.safetensors, its shards
// (model-00001-of-00003.safetensors) or model.safetensors.index.json.
bool is_weight_file_name(const std::string& name);

// Writes dir/model.safetensors when all tensors fit in max_shard_bytes (0 = no limit), else shards
// model-0000K-of-0000M.safetensors (tensors kept whole and in order; a new shard starts when the next
// tensor would exceed the limit, so a tensor larger than the limit gets a shard of its own) plus
// model.safetensors.index.json. Each file is written atomically, the index last; then files of an
// earlier save that the new one does not use (the other layout, surplus shards) are removed.
// Creates dir. Validates all tensors before writing any file.
void save_weight_directory(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                           uint64_t max_shard_bytes = 0,
                           const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace tessera::io
