#include "core/io/weight_directory.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <set>

#include "core/error.h"
#include "core/io/detail/posix_file.h"
#include "core/io/detail/strict_json.h"

namespace tessera::io {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSingleName = "model.safetensors";
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr uint64_t kMaxIndexBytes = uint64_t(100) << 20;

// A shard must be a file directly inside the directory.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name.find('\\') == std::string::npos &&
         name.find("..") == std::string::npos && name.find('\0') == std::string::npos && name != ".";
}

bool shard_file_name(const std::string& name) {  // model-00001-of-00003.safetensors
  const std::string suffix = ".safetensors";
  return name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos && name.size() > suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string shard_name(size_t k, size_t m) {
  char text[64];
  std::snprintf(text, sizeof text, "model-%05zu-of-%05zu.safetensors", k, m);
  return text;
}

}  // namespace

WeightDirectory::WeightDirectory(std::string dir) : dir_(std::move(dir)) {
  const fs::path single = fs::path(dir_) / kSingleName;
  const std::string index_path = (fs::path(dir_) / kIndexName).string();
  std::error_code ignored;
  if (fs::exists(single, ignored)) {
    files_.push_back(std::make_shared<const SafetensorsFile>(single.string()));
    for (const auto& tensor : files_[0]->header().tensors) where_.emplace(tensor.name, 0);
    return;
  }
  if (!fs::exists(index_path, ignored))
    throw CheckpointError(dir_ + ": no weights: neither " + kSingleName + " nor " + kIndexName + " exists");

  detail::ReadOnlyFile index_file(index_path);
  const uint64_t size = index_file.size_bytes();
  if (size > kMaxIndexBytes)
    throw CheckpointError(index_path + ": " + std::to_string(size) + " bytes, over the limit of " +
                          std::to_string(kMaxIndexBytes));
  std::string text(size_t(size), '\0');
  index_file.pread_exact(text.data(), size, 0, "the index");
  const nlohmann::json root = detail::parse_strict_json(text, 16, index_path);
  auto refuse = [&](const std::string& why) { throw CheckpointError(index_path + ": " + why); };
  if (!root.is_object()) refuse("top level is not a JSON object");
  if (root.contains("metadata")) {
    const auto& metadata = root.at("metadata");
    if (!metadata.is_object()) refuse("\"metadata\" is not an object");
    if (metadata.contains("total_size") &&
        !(metadata.at("total_size").is_number() && metadata.at("total_size").get<double>() >= 0))
      refuse("\"metadata.total_size\" is not a non-negative number");
  }
  if (!root.contains("weight_map") || !root.at("weight_map").is_object()) refuse("no \"weight_map\" object");

  std::map<std::string, std::string> shard_of;      // tensor -> shard file name, from the index
  std::map<std::string, size_t> shard_position;     // shard file name -> position in files_
  for (const auto& [name, shard] : root.at("weight_map").items()) {
    if (!shard.is_string()) refuse("tensor '" + name + "': the shard is not a string");
    const std::string& file = shard.get_ref<const std::string&>();
    if (!plain_file_name(file))
      refuse("tensor '" + name + "': shard '" + file + "' is not a plain file name inside " + dir_);
    shard_of.emplace(name, file);
    shard_position.emplace(file, 0);
  }
  for (auto& [file, position] : shard_position) {
    try {
      files_.push_back(std::make_shared<const SafetensorsFile>((fs::path(dir_) / file).string()));
    } catch (const CheckpointError& e) {
      refuse("shard '" + file + "': " + e.what());
    }
    position = files_.size() - 1;
  }
  for (const auto& [file, position] : shard_position) {
    for (const auto& tensor : files_[position]->header().tensors) {
      const auto listed = shard_of.find(tensor.name);
      const auto [seen, fresh] = where_.emplace(tensor.name, position);
      if (!fresh)
        refuse("tensor '" + tensor.name + "' is in two shards: '" +
               fs::path(files_[seen->second]->path()).filename().string() + "' and '" + file + "'");
      if (listed == shard_of.end())
        refuse("shard '" + file + "' holds tensor '" + tensor.name + "' that the weight_map does not list");
    }
  }
  for (const auto& [name, file] : shard_of) {
    const size_t position = shard_position.at(file);
    if (!files_[position]->contains(name))
      refuse("tensor '" + name + "' is listed in shard '" + file + "' but " + files_[position]->path() +
             " has no such tensor");
    if (where_.at(name) != position)
      refuse("tensor '" + name + "' is listed in shard '" + file + "' but lies in '" +
             fs::path(files_[where_.at(name)]->path()).filename().string() + "'");
  }
}

std::vector<std::string> WeightDirectory::names() const {
  std::vector<std::string> out;
  out.reserve(where_.size());
  for (const auto& [name, position] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& WeightDirectory::file_of(const std::string& name) const {
  const auto found = where_.find(name);
  if (found == where_.end()) throw CheckpointError(dir_ + ": no tensor '" + name + "'");
  return *files_[found->second];
}

const StTensorInfo& WeightDirectory::info(const std::string& name) const { return file_of(name).info(name); }

at::Tensor WeightDirectory::read(const std::string& name) const { return file_of(name).read(name); }

void WeightDirectory::read_into(const std::string& name, at::Tensor destination) const {
  file_of(name).read_into(name, std::move(destination));
}

bool is_weight_file_name(const std::string& name) {
  return name == kSingleName || name == kIndexName || shard_file_name(name);
}

void save_weight_directory(const std::string& dir, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                           uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata) {
  // Validate everything before the first file (write_safetensors checks again, per shard).
  std::set<std::string> names;
  std::vector<uint64_t> bytes;
  uint64_t total_bytes = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string where = dir + ": tensor '" + name + "': ";
    if (!names.insert(name).second) throw CheckpointError(where + "the name appears twice");
    if (name == "__metadata__") throw CheckpointError(where + "the name is reserved for metadata");
    if (!tensor.defined()) throw CheckpointError(where + "undefined tensor");
    try {
      bytes.push_back(uint64_t(tensor.numel()) * element_size(from_scalar_type(tensor.scalar_type())));
    } catch (const CheckpointError& e) {
      throw CheckpointError(where + e.what());
    }
    total_bytes += bytes.back();
  }
  // Shards as [first, last) runs of tensors.
  std::vector<std::pair<size_t, size_t>> shards;
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (shards.empty() || (shards.back().second > shards.back().first && max_shard_bytes != 0 &&
                           shard_bytes + bytes[i] > max_shard_bytes)) {
      shards.emplace_back(i, i);
      shard_bytes = 0;
    }
    shards.back().second = i + 1;
    shard_bytes += bytes[i];
  }

  std::error_code error;
  fs::create_directories(dir, error);
  if (error) throw CheckpointError(dir + ": cannot create the directory: " + error.message());
  std::set<std::string> written;
  if (shards.size() <= 1) {
    write_safetensors((fs::path(dir) / kSingleName).string(), tensors, metadata);
    written.insert(kSingleName);
  } else {
    nlohmann::json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t k = 0; k < shards.size(); ++k) {
      const std::string file = shard_name(k + 1, shards.size());
      const std::vector<std::pair<std::string, at::Tensor>> part(tensors.begin() + long(shards[k].first),
                                                                  tensors.begin() + long(shards[k].second));
      write_safetensors((fs::path(dir) / file).string(), part, metadata);
      for (const auto& [name, tensor] : part) index["weight_map"][name] = file;
      written.insert(file);
    }
    const std::string text = index.dump(2) + "\n";
    detail::write_file_atomically((fs::path(dir) / kIndexName).string(), {{text.data(), text.size()}});
    written.insert(kIndexName);
  }
  // Leftovers of an earlier save would shadow (model.safetensors wins) or confuse readers.
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file_name(name) && written.count(name) == 0) fs::remove(entry.path(), error);
  }
}

}  // namespace tessera::io
