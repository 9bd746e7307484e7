#include "core/checkpoint/consolidate.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/hf_shards.h"
#include "core/checkpoint/saved_tensor_reader.h"
#include "core/checkpoint/tensor_file_writer.h"
#include "core/checkpoint/verify.h"
#include "core/checkpoint/staged_directory.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {
namespace {

struct Item {
  OutputTensor out;
  const SavedMap* saved = nullptr;
  affine::Plan plan;
};

// A frozen parameter as a map: its file's buffer holds it whole, flat (the output gets its shape).
SavedMap frozen_map(const FrozenTensor& f) {
  SavedMap saved;
  saved.kind = "frozen";
  saved.map.name = f.name, saved.map.dtype = f.dtype;
  const int64_t n = f.shape.product();
  saved.map.shape = affine::Dims{n};
  auto& storage = saved.map.ranks[f.file];
  storage.buffer_elements = n;
  storage.pieces.push_back({affine::Box(affine::Dims{0}, affine::Dims{n}), 0, affine::Dims{1}, {f.file}});
  saved.buffers[f.file] = f.buffer;
  return saved;
}

std::string kinds_of(const Manifest& m) {
  std::string text;
  for (const auto& k : m.kinds) text += (text.empty() ? "" : ", ") + k;
  return text;
}

// The fp32 copy of the weights: the masters where the checkpoint has them, else fp32 weights.
std::string choose_kind(const Manifest& m, const std::string& where) {
  if (std::count(m.kinds.begin(), m.kinds.end(), "master")) return "master";
  bool fp32 = std::count(m.kinds.begin(), m.kinds.end(), "param") != 0;
  for (const auto& p : m.parameters) fp32 = fp32 && p.dtype == affine::DType::f32;
  if (fp32) return "param";
  throw CheckpointError(where + ": holds no fp32 masters and its weights are " + m.dtype + " (kinds: " + kinds_of(m) +
                        "); consolidate writes fp32 weights only");
}

// Every tensor planned before anything is written: a bad map is refused with nothing on disk.
std::vector<Item> plan_items(const Manifest& m, const std::string& kind, const SavedTensorReader& reader,
                             const std::string& where) {
  if (m.parameters.empty()) throw CheckpointError(where + ": lists no parameters");
  std::map<std::string, const SavedMap*> maps;
  for (const auto& s : m.maps)
    if (s.kind == kind) maps[s.map.name] = &s;
  std::vector<Item> items;
  for (const auto& p : m.parameters) {
    const auto it = maps.find(p.name);
    if (it == maps.end()) throw CheckpointError(where + ": holds no '" + kind + "' of tensor '" + p.name + "'");
    const auto& map = it->second->map;
    if (!(map.shape == p.shape) || map.dtype != affine::DType::f32)
      throw CheckpointError(where + ": the '" + kind + "' of tensor '" + p.name + "' is " + affine::dtype_name(map.dtype) +
                            " " + affine::to_string(map.shape) + ", the parameter " + affine::to_string(p.shape) +
                            " (fp32 expected)");
    items.push_back({{p.name, map.dtype, map.shape}, it->second, reader.plan(*it->second)});
  }
  return items;
}

std::unique_ptr<TensorFileWriter> open_writer(ConsolidateFormat format, const std::string& path,
                                              const std::vector<OutputTensor>& tensors) {
  if (format == ConsolidateFormat::safetensors) return safetensors_writer(path, tensors, {{"format", "pt"}});
  return pytorch_bin_writer(path, tensors);
}

}  // namespace

ConsolidateFormat parse_consolidate_format(const std::string& name) {
  if (name == "safetensors") return ConsolidateFormat::safetensors;
  if (name == "bin") return ConsolidateFormat::pytorch_bin;
  throw CheckpointError("consolidate: unknown format '" + name + "' (safetensors or bin)");
}

ConsolidateReport consolidate(const std::string& dir, const std::string& out, const ConsolidateOptions& options) {
  ConsolidateReport report;
  if (!options.tag.empty()) check_tag(options.tag);
  report.tag_dir = options.tag.empty() ? tag_directory(dir) : (fs::path(dir) / options.tag).string();
  const auto manifest = read_manifest(report.tag_dir);
  const auto where = (fs::path(report.tag_dir) / kManifestName).string();
  report.kind = choose_kind(manifest, where);
  SavedTensorReader reader(manifest, report.tag_dir);  // every file there, at its size
  auto items = plan_items(manifest, report.kind, reader, where);
  std::vector<SavedMap> frozen;  // kept alive for the items pointing at them
  frozen.reserve(manifest.frozen.size());
  for (size_t i = 0; i < manifest.frozen.size() && !options.exclude_frozen_parameters; ++i) {
    const auto& f = manifest.frozen[i];
    frozen.push_back(frozen_map(f));
    items.push_back({{f.name, f.dtype, f.shape}, &frozen.back(), reader.plan(frozen.back())});
    ++report.frozen;
  }

  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (const auto& item : items) {
    sizes.push_back(item.out.bytes());
    names.push_back(item.out.name);
    report.tensor_bytes += item.out.bytes();
    report.largest_tensor_bytes = std::max(report.largest_tensor_bytes, item.out.bytes());
  }
  const bool st = options.format == ConsolidateFormat::safetensors;
  const std::string stem = st ? "model" : "pytorch_model", ext = st ? "safetensors" : "bin";
  const auto shards = plan_shards(sizes, options.max_shard_bytes, stem, ext);

  StagedDirectory output(out, "consolidate");
  report.out_dir = output.out();
  // The one tensor buffer, reused: pages are touched as the largest tensor needs them.
  std::unique_ptr<char[]> buffer(new char[size_t(std::max<int64_t>(report.largest_tensor_bytes, 1))]);
  for (const auto& shard : shards) {
    std::vector<OutputTensor> tensors;
    for (size_t i : shard.tensors) tensors.push_back(items[i].out);
    auto writer = open_writer(options.format, output.path_of(shard.file), tensors);
    for (size_t i : shard.tensors) {
      reader.read(*items[i].saved, items[i].plan, buffer.get());
      writer->write(items[i].out.name, buffer.get(), items[i].out.bytes());
      ++report.tensors;
    }
    writer->finish();
    report.files.push_back(shard.file);
  }
  if (shards.size() > 1) {
    const auto index = shard_index_json(shards, names, report.tensor_bytes);
    OutputFile file(output.path_of(shard_index_name(stem, ext)));
    file.write(index.data(), index.size());
    file.sync_and_close();
    report.files.push_back(shard_index_name(stem, ext));
  }
  output.commit();
  report.bytes_read = reader.bytes_read();
  return report;
}

}  // namespace tessera::checkpoint
