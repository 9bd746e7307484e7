#include "core/checkpoint/deepspeed/universal_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>

#include "core/affine/zero_storage.h"
#include "core/checkpoint/deepspeed/torch_archive.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint::deepspeed {
namespace {

using Bytes = std::vector<char>;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One full fp32 tensor of a parameter's folder: {'param': tensor, ...} or the bare tensor.
Bytes read_full(const fs::path& file, const DsParameter& p) {
  if (!fs::is_regular_file(file)) throw CheckpointError(file.string() + ": missing (parameter '" + p.name + "')");
  TorchArchive a(file.string());
  const auto& root = a.root();
  const auto& value = root.kind == PickleKind::tensor ? root : root.at("param", file.string());
  const auto& t = value.as_tensor(file.string() + " '" + p.name + "'");
  if (t.storage.dtype != affine::DType::f32)
    throw CheckpointError(file.string() + ": '" + p.name + "' is " + describe(value) + " (float32 expected)");
  if (t.shape != p.shape)
    throw CheckpointError(file.string() + ": '" + p.name + "' has shape " + shape_text(t.shape) + ", param_shapes says " +
                          shape_text(p.shape));
  return a.read(t, p.name);
}

// step.pt: a float32 scalar tensor (torch's Adam) or a plain number.
double read_step(const fs::path& file, const std::string& name) {
  TorchArchive a(file.string());
  const auto& v = a.root();
  if (v.kind != PickleKind::tensor) return v.as_double(file.string() + " step of '" + name + "'");
  const auto b = a.read(v.tensor, "step of " + name);
  if (v.tensor.storage.dtype != affine::DType::f32 || b.size() != 4)
    throw CheckpointError(file.string() + ": the step of '" + name + "' is " + describe(v) + " (a float32 scalar expected)");
  float f = 0;
  std::memcpy(&f, b.data(), 4);
  return double(f);
}

// The optimizer states a parameter folder holds: every .pt but fp32.pt and step.pt, sorted.
std::vector<std::string> state_names_in(const fs::path& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(folder, ec)) {
    const auto file = e.path().filename().string();
    if (e.path().extension() != ".pt" || file == "fp32.pt" || file == "step.pt") continue;
    names.push_back(e.path().stem().string());
  }
  if (ec) throw CheckpointError(folder.string() + ": " + ec.message());
  std::sort(names.begin(), names.end());
  return names;
}

// ZeRO-1/2: the group's tensors concatenated, padded to a multiple of 2 x W, cut into W partitions.
std::vector<Bytes> zero12_partitions(const std::vector<Bytes>& tensors, int W) {
  Bytes flat;
  for (const auto& t : tensors) flat.insert(flat.end(), t.begin(), t.end());
  const int64_t n = int64_t(flat.size() / 4), align = 2 * int64_t(W);
  flat.resize(size_t((n + align - 1) / align * align) * 4, 0);
  const size_t P = flat.size() / size_t(W);
  std::vector<Bytes> out;
  for (int r = 0; r < W; ++r) out.emplace_back(flat.begin() + long(size_t(r) * P), flat.begin() + long(size_t(r + 1) * P));
  return out;
}

// ZeRO-3: on each rank, every tensor's ceil(numel / W) share (zero-padded), concatenated.
std::vector<Bytes> zero3_partitions(const std::vector<Bytes>& tensors, int W) {
  std::vector<Bytes> out(static_cast<size_t>(W));
  for (const auto& t : tensors) {
    const int64_t n = int64_t(t.size() / 4), share = affine::zero3_partition_elements(n, W);
    for (int r = 0; r < W; ++r) {
      const int64_t begin = std::min(n, r * share), end = std::min(n, (r + 1) * share);
      out[size_t(r)].insert(out[size_t(r)].end(), t.begin() + long(begin * 4), t.begin() + long(end * 4));
      out[size_t(r)].resize(out[size_t(r)].size() + size_t(share - (end - begin)) * 4, 0);
    }
  }
  return out;
}

// Reads every parameter's folder into the groups' per-rank buffers; returns the optimizer step.
double read_parameter_folders(DsCheckpoint& ds, const fs::path& zero) {
  std::optional<double> step;
  std::string step_file;
  for (auto& group : ds.groups) {
    std::vector<Bytes> masters;
    std::map<std::string, std::vector<Bytes>> states;
    for (const auto& p : group.parameters) {
      const auto folder = zero / p.name;
      if (!fs::is_directory(folder))
        throw CheckpointError(folder.string() + ": missing (the universal folder of parameter '" + p.name + "')");
      if (const auto names = state_names_in(folder); names != ds.state_names)
        throw CheckpointError(folder.string() + ": optimizer states of '" + p.name + "' differ from those of '" +
                              ds.groups[0].parameters[0].name + "'");
      masters.push_back(read_full(folder / "fp32.pt", p));
      for (const auto& name : ds.state_names) states[name].push_back(read_full(folder / (name + ".pt"), p));
      const auto step_path = folder / "step.pt";
      const bool here = fs::is_regular_file(step_path);
      if (!step_file.empty() && here != step.has_value())
        throw CheckpointError(step_path.string() + (here ? ": present" : ": missing") + ", unlike " + step_file);
      if (step_file.empty()) step_file = step_path.string();
      if (!here) continue;
      const double s = read_step(step_path, p.name);
      if (step && *step != s)
        throw CheckpointError(step_path.string() + ": step " + std::to_string(s) + ", " + step_file + " says " + std::to_string(*step));
      step = s;
    }
    const auto cut = ds.layout == DsLayout::zero3 ? zero3_partitions : zero12_partitions;
    group.master = cut(masters, ds.world);
    for (const auto& name : ds.state_names) group.states[name] = cut(states[name], ds.world);
  }
  return step.value_or(0.0);
}

}  // namespace

bool is_universal_tag(const std::string& tag_dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(tag_dir) / "zero" / "optimizer_state.pt", ec);
}

void read_universal(DsCheckpoint& ds) {
  ds.universal = true;
  const auto zero = fs::path(ds.tag_dir) / "zero";
  const auto path = (zero / "optimizer_state.pt").string();
  TorchArchive a(path);
  const auto& osd = a.root();
  ds.stage = detail::stage_of(osd, ds);
  ds.layout = ds.stage == 3 ? DsLayout::zero3 : DsLayout::zero12;
  if (ds.world < 1) throw CheckpointError(path + ": dp_world_size " + std::to_string(ds.world));
  for (const auto& group : osd.at("param_groups", path).as_sequence(path + " param_groups"))
    ds.group_lrs.push_back(group->at("lr", path + " param_groups").as_double(path + " lr"));
  if (const auto* scaler = osd.find("loss_scaler"); scaler && !scaler->is_none() && ds.dtype == affine::DType::f16) {
    ds.has_loss_scaler = true;
    ds.loss_scaler = detail::loss_scaler_of(*scaler, path);
  }
  if (ds.layout == DsLayout::zero3) {  // one flat group, parameters in the order of all groups
    DsFlatGroup all;
    for (auto& g : ds.groups) all.parameters.insert(all.parameters.end(), g.parameters.begin(), g.parameters.end());
    ds.groups = {std::move(all)};
  } else if (ds.group_lrs.size() != ds.groups.size()) {
    throw CheckpointError(path + ": " + std::to_string(ds.group_lrs.size()) + " param_groups, the model states' param_shapes " +
                          std::to_string(ds.groups.size()));
  }
  if (ds.groups.empty() || ds.groups[0].parameters.empty()) throw CheckpointError(path + ": no parameters to read");
  ds.state_names = state_names_in(zero / ds.groups[0].parameters[0].name);
  const double step = read_parameter_folders(ds, zero);
  if (step < 0 || step != std::floor(step)) throw CheckpointError(path + ": optimizer step " + std::to_string(step));
  ds.optimizer_step = int64_t(step);
}

}  // namespace tessera::checkpoint::deepspeed
