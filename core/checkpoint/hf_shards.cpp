#include "core/checkpoint/hf_shards.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "core/error.h"

namespace tessera::checkpoint {

std::vector<ShardFile> plan_shards(const std::vector<int64_t>& tensor_bytes, int64_t max_shard_bytes,
                                   const std::string& stem, const std::string& ext) {
  if (max_shard_bytes <= 0)
    throw CheckpointError("the largest shard must be a positive number of bytes, not " + std::to_string(max_shard_bytes));
  std::vector<ShardFile> shards(1);
  for (size_t i = 0; i < tensor_bytes.size(); ++i) {
    if (!shards.back().tensors.empty() && shards.back().bytes + tensor_bytes[i] > max_shard_bytes)
      shards.emplace_back();
    shards.back().tensors.push_back(i);
    shards.back().bytes += tensor_bytes[i];
  }
  if (shards.size() == 1) {
    shards[0].file = stem + "." + ext;
    return shards;
  }
  for (size_t s = 0; s < shards.size(); ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "-%05zu-of-%05zu.", s + 1, shards.size());
    shards[s].file = stem + name + ext;
  }
  return shards;
}

std::string shard_index_name(const std::string& stem, const std::string& ext) { return stem + "." + ext + ".index.json"; }

std::string shard_index_json(const std::vector<ShardFile>& shards, const std::vector<std::string>& names,
                             int64_t total_size) {
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (const auto& shard : shards)
    for (size_t i : shard.tensors) weight_map[names.at(i)] = shard.file;
  nlohmann::ordered_json index{{"metadata", {{"total_size", total_size}}}, {"weight_map", weight_map}};
  return index.dump(2) + "\n";
}

}  // namespace tessera::checkpoint
