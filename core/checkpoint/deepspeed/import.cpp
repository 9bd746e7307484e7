#include "core/checkpoint/deepspeed/import.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/affine/zero_storage.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/deepspeed/ds_checkpoint.h"
#include "core/checkpoint/manifest.h"
#include "core/checkpoint/rank_file_writer.h"
#include "core/checkpoint/staged_directory.h"
#include "core/checkpoint/tensor_file_writer.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint::deepspeed {
namespace {

// fp32 masters rounded to the weights' dtype, as torch's copy_ rounds (to nearest even).
std::vector<char> rounded(const std::vector<char>& f32, affine::DType to) {
  const size_t n = f32.size() / 4;
  std::vector<char> out(n * 2);
  const auto* in = reinterpret_cast<const float*>(f32.data());
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits = 0;
    if (to == affine::DType::bf16) bits = c10::BFloat16(in[i]).x;
    else bits = c10::Half(in[i]).x;
    std::memcpy(out.data() + 2 * i, &bits, 2);
  }
  return out;
}

// A rank-file buffer over bytes held here (alive until the file is written).
RankFileBuffer bytes_of(std::string key, affine::DType dtype, const std::vector<char>& bytes) {
  return {std::move(key), dtype, bytes.data(), int64_t(bytes.size())};
}

// Where the elements of parameter `index` of a flat group lie on each rank (ds_checkpoint.h).
std::vector<affine::StoredRun> runs_of(const DsCheckpoint& ds, const DsFlatGroup& group, size_t index) {
  std::vector<affine::StoredRun> runs;
  const int W = ds.world;
  int64_t offset = 0;  // ZeRO-1/2: in the whole flat group; ZeRO-3: in every rank's buffer
  for (size_t i = 0; i < index; ++i)
    offset += ds.layout == DsLayout::zero3 ? affine::zero3_partition_elements(group.parameters[i].elements(), W)
                                           : group.parameters[i].elements();
  const int64_t n = group.parameters[index].elements();
  for (int r = 0; r < W; ++r) {
    if (ds.layout == DsLayout::zero3) {
      const int64_t P = affine::zero3_partition_elements(n, W);
      const int64_t begin = std::min(n, r * P), end = std::min(n, (r + 1) * P);
      if (begin < end) runs.push_back({r, begin, end, offset});
      continue;
    }
    const int64_t P = group.rank_elements(0);
    const int64_t begin = std::max(offset, r * P), end = std::min(offset + n, (r + 1) * P);
    if (begin < end) runs.push_back({r, begin - offset, end - offset, begin - r * P});
  }
  return runs;
}

// The checkpoint's maps: per parameter, its master, its states and its weights.
std::vector<SavedMap> saved_maps(const DsCheckpoint& ds, const std::vector<std::string>& kinds) {
  std::vector<SavedMap> maps;
  for (size_t g = 0; g < ds.groups.size(); ++g) {
    const auto& group = ds.groups[g];
    std::map<int, int64_t> buffer_elements;
    for (int r = 0; r < ds.world; ++r) buffer_elements[r] = group.rank_elements(r);
    for (size_t i = 0; i < group.parameters.size(); ++i) {
      const auto& p = group.parameters[i];
      const auto runs = runs_of(ds, group, i);
      for (const auto& kind : kinds) {
        const bool weights16 = kind == "param" && ds.dtype != affine::DType::f32;
        const std::string buffer = (kind == "param" && !weights16 ? "master" : kind) + "/" + std::to_string(g);
        SavedMap m;
        m.kind = kind;
        m.map = affine::stored_runs({p.name, weights16 ? ds.dtype : affine::DType::f32, affine::Dims(p.shape)}, runs,
                                    buffer_elements);
        for (int r = 0; r < ds.world; ++r) m.buffers[r] = buffer;
        maps.push_back(std::move(m));
      }
    }
  }
  return maps;
}

Manifest manifest_of(const DsCheckpoint& ds) {
  Manifest m;
  m.tag = ds.tag, m.world_size = ds.world, m.stage = ds.stage, m.tp_size = 1;
  m.dtype = affine::dtype_name(ds.dtype);
  std::map<std::string, const DsParameter*> by_name;
  for (const auto& g : ds.groups)
    for (const auto& p : g.parameters) by_name[p.name] = &p;
  for (const auto& name : ds.parameter_order)
    m.parameters.push_back({name, ds.dtype, affine::Dims(by_name.at(name)->shape)});
  for (size_t i = 0; i < ds.frozen.size(); ++i)  // whole, in rank 0's file (import_deepspeed writes them there)
    m.frozen.push_back({ds.frozen[i].name, ds.frozen[i].dtype, affine::Dims(ds.frozen[i].shape), 0,
                        "frozen/" + std::to_string(i)});
  m.kinds = {"param", "master"};
  m.kinds.insert(m.kinds.end(), ds.state_names.begin(), ds.state_names.end());
  auto& c = m.engine;
  c.global_steps = ds.global_steps, c.skipped_steps = ds.skipped_steps;
  c.micro_steps = ds.global_steps * ds.gradient_accumulation_steps;
  c.optimizer_updates = ds.optimizer_step;
  c.group_lrs = ds.group_lrs, c.last_lrs = ds.group_lrs;
  if (ds.has_loss_scaler) {
    c.has_loss_scaler = true;
    c.loss_scaler.scale = ds.loss_scaler.scale;
    c.loss_scaler.iteration = ds.loss_scaler.iteration;
    c.loss_scaler.last_overflow_iteration = ds.loss_scaler.last_overflow_iteration;
    c.loss_scaler.hysteresis_left = ds.loss_scaler.hysteresis_left;
    c.loss_scaler.skipped_steps = ds.skipped_steps;
  }
  m.config = ds.config_json;
  return m;
}

}  // namespace

ImportReport import_deepspeed(const std::string& ds_dir, const std::string& out, const ImportOptions& options) {
  const auto ds = read_deepspeed_checkpoint(ds_dir, options.tag);  // every file read and checked first
  ImportReport report;
  report.source_dir = ds.tag_dir, report.out_dir = out, report.tag = ds.tag;
  report.stage = ds.stage, report.world = ds.world, report.dtype = affine::dtype_name(ds.dtype);
  auto manifest = manifest_of(ds);
  for (const auto& p : manifest.parameters) ++report.parameters, report.elements += p.shape.product();
  manifest.maps = saved_maps(ds, manifest.kinds);

  StagedDirectory staged(out, "import");
  const auto tag_dir = staged.staged() / ds.tag;
  fs::create_directory(tag_dir);
  for (int r = 0; r < ds.world; ++r) {
    std::vector<std::vector<char>> weights16;  // kept alive until the file is written
    weights16.reserve(ds.groups.size());
    std::vector<RankFileBuffer> buffers;
    for (size_t g = 0; g < ds.groups.size(); ++g) {
      const auto& group = ds.groups[g];
      const auto suffix = "/" + std::to_string(g);
      buffers.push_back(bytes_of("master" + suffix, affine::DType::f32, group.master[size_t(r)]));
      for (const auto& name : ds.state_names)
        buffers.push_back(bytes_of(name + suffix, affine::DType::f32, group.states.at(name)[size_t(r)]));
      if (ds.dtype == affine::DType::f32) continue;
      weights16.push_back(rounded(group.master[size_t(r)], ds.dtype));
      buffers.push_back(bytes_of("param" + suffix, ds.dtype, weights16.back()));
    }
    for (size_t i = 0; r == 0 && i < ds.frozen.size(); ++i)
      buffers.push_back(bytes_of(manifest.frozen[i].buffer, ds.frozen[i].dtype, ds.frozen[i].bytes));
    const auto path = (tag_dir / ("rank" + std::to_string(r) + ".safetensors")).string();
    manifest.files.push_back(write_rank_file(path, r, buffers, {{"source", "deepspeed"}}));
    report.bytes_written += manifest.files.back().bytes;
  }
  const auto text = to_json(manifest);
  OutputFile file((tag_dir / kManifestName).string());
  file.write(text.data(), text.size());
  file.sync_and_close();
  fsync_path(tag_dir.string());
  write_latest(staged.staged().string(), ds.tag);
  staged.commit();
  return report;
}

}  // namespace tessera::checkpoint::deepspeed
