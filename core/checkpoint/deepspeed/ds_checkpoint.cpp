#include "core/checkpoint/deepspeed/ds_checkpoint.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <set>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/deepspeed/torch_archive.h"
#include "core/checkpoint/deepspeed/universal_checkpoint.h"
#include "core/checkpoint/manifest.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint::deepspeed {
namespace {

using nlohmann::json;

std::string trimmed(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.erase(s.begin());
  return s;
}

// DIR/latest, else DIR/latest_universal (what ds_to_universal writes); "" when neither.
fs::path latest_file(const std::string& dir) {
  std::error_code ec;
  for (const char* name : {"latest", "latest_universal"})
    if (fs::is_regular_file(fs::path(dir) / name, ec)) return fs::path(dir) / name;
  return {};
}

std::string resolve_tag(const std::string& dir, const std::string& tag) {
  if (!tag.empty()) return tag;
  const auto latest = latest_file(dir);
  if (latest.empty())
    throw CheckpointError(dir + ": no 'latest' or 'latest_universal' file naming a DeepSpeed tag (pass a tag)");
  return trimmed(read_text(latest.string()));
}

std::string model_states_file(const fs::path& tag_dir) {
  for (const char* name : {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt"})
    if (fs::is_regular_file(tag_dir / name)) return (tag_dir / name).string();
  return "";
}

json to_json(const PickleValue& v) {
  switch (v.kind) {
    case PickleKind::none: return nullptr;
    case PickleKind::boolean: return v.boolean;
    case PickleKind::integer: return v.integer;
    case PickleKind::floating: return v.floating;
    case PickleKind::string: return v.text;
    case PickleKind::list: case PickleKind::tuple: case PickleKind::set: {
      json a = json::array();
      for (const auto& i : v.items) a.push_back(to_json(*i));
      return a;
    }
    case PickleKind::dict: case PickleKind::object: {
      json o = json::object();
      for (const auto& [k, x] : v.entries) o[k->kind == PickleKind::string ? k->text : describe(*k)] = to_json(*x);
      return o;
    }
    default: return describe(v);
  }
}

int64_t dim_of(const PickleValue& d, const std::string& where) { return d.as_int(where); }

// A dict entry of the model-states file that may be absent or None (older files, nothing frozen).
const PickleValue* optional_dict(const PickleValue& root, const char* key, const std::string& path) {
  const auto* v = root.find(key);
  if (!v || v->is_none()) return nullptr;
  if (v->kind != PickleKind::dict) throw CheckpointError(path + ": " + key + " is a " + kind_name(v->kind));
  return v;
}

// Frozen parameters' names and shapes (frozen_param_shapes); their bytes come from the fragments.
void read_frozen_shapes(DsCheckpoint& ds, const PickleValue& root, const std::string& path) {
  const auto* shapes = optional_dict(root, "frozen_param_shapes", path);
  if (!shapes) return;
  for (const auto& [name, shape] : shapes->entries) {
    DsFrozen f;
    f.name = name->as_string(path + " frozen_param_shapes");
    for (const auto& d : shape->as_sequence(path + " frozen_param_shapes '" + f.name + "'")) f.shape.push_back(dim_of(*d, path));
    ds.frozen.push_back(std::move(f));
  }
}

// Appends one file's fragments of the frozen parameters (ZeRO-1/2: the whole tensors; ZeRO-3: this
// rank's partitions), checking dtypes agree.
void read_frozen_fragments(DsCheckpoint& ds, const TorchArchive& a, const std::string& path) {
  if (ds.frozen.empty()) return;
  const auto* fragments = optional_dict(a.root(), "frozen_param_fragments", path);
  if (!fragments) throw CheckpointError(path + ": frozen_param_shapes lists frozen parameters, frozen_param_fragments is missing");
  for (auto& f : ds.frozen) {
    const PickleValue* found = nullptr;
    for (const auto& [name, t] : fragments->entries)
      if (name->as_string(path) == f.name) found = t.get();
    if (!found) throw CheckpointError(path + ": frozen parameter '" + f.name + "' has no entry in frozen_param_fragments");
    const auto& ref = found->as_tensor(path + " frozen_param_fragments '" + f.name + "'");
    if (!f.bytes.empty() && ref.storage.dtype != f.dtype)
      throw CheckpointError(path + ": frozen parameter '" + f.name + "' is " + affine::dtype_name(ref.storage.dtype) +
                            " here, " + affine::dtype_name(f.dtype) + " in the files before");
    f.dtype = ref.storage.dtype;
    const auto bytes = a.read(ref, "frozen parameter '" + f.name + "'");
    f.bytes.insert(f.bytes.end(), bytes.begin(), bytes.end());
  }
}

// Each frozen parameter's bytes cut to its shape (ZeRO-3: the partitions' padding dropped); a
// fragment too short (or, ZeRO-1/2, of another size) is an error naming it.
void finish_frozen(DsCheckpoint& ds, const std::string& path) {
  for (auto& f : ds.frozen) {
    int64_t n = 1;
    for (auto d : f.shape) n *= d;
    const auto want = size_t(n * affine::element_size(f.dtype));
    const bool exact = ds.layout == DsLayout::zero12;
    if (f.bytes.size() < want || (exact && f.bytes.size() != want))
      throw CheckpointError(path + ": frozen parameter '" + f.name + "' has " + std::to_string(f.bytes.size()) +
                            " bytes of fragments, its shape needs " + std::to_string(want));
    f.bytes.resize(want);
  }
}

// What the model-states file says: names, shapes, dtype, counters, config.
void read_model_states(DsCheckpoint& ds, const std::string& path) {
  TorchArchive a(path);
  const auto& root = a.root();
  read_frozen_shapes(ds, root, path);
  read_frozen_fragments(ds, a, path);  // ZeRO-3: rank 0's partitions (the other ranks' follow)
  ds.world = int(root.at("dp_world_size", path).as_int(path));
  if (const auto* mp = root.find("mp_world_size"); mp && mp->as_int(path) != 1)
    throw CheckpointError(path + ": saved at model-parallel size " + std::to_string(mp->as_int(path)) +
                          "; this importer reads model-parallel size 1 only");
  ds.global_steps = root.at("global_steps", path).as_int(path);
  ds.skipped_steps = root.at("skipped_steps", path).as_int(path);
  if (const auto* s = root.find("global_samples")) ds.global_samples = s->as_int(path);
  if (const auto* c = root.find("ds_config"); c && !c->is_none()) {
    const auto config = to_json(*c);
    ds.config_json = config.dump();
    if (config.contains("gradient_accumulation_steps") && config["gradient_accumulation_steps"].is_number_integer())
      ds.gradient_accumulation_steps = config["gradient_accumulation_steps"].get<int64_t>();
  }
  std::set<std::string> trainable;
  for (const auto& group : root.at("param_shapes", path).as_sequence(path + " param_shapes")) {
    DsFlatGroup g;
    for (const auto& [name, shape] : group->entries) {
      DsParameter p{name->as_string(path), {}};
      for (const auto& d : shape->as_sequence(path + " param_shapes '" + p.name + "'")) p.shape.push_back(dim_of(*d, path));
      trainable.insert(p.name);
      g.parameters.push_back(std::move(p));
    }
    ds.groups.push_back(std::move(g));
  }
  bool dtype_known = false;
  for (const auto& [name, t] : root.at("module", path).entries) {
    if (!trainable.count(name->as_string(path))) continue;  // buffers and frozen weights
    ds.parameter_order.push_back(name->text);
    const auto dtype = t->as_tensor(path + " module '" + name->text + "'").storage.dtype;
    if (dtype_known && dtype != ds.dtype)
      throw CheckpointError(path + ": module weights of mixed dtypes (" + name->text + " is " + affine::dtype_name(dtype) + ")");
    ds.dtype = dtype, dtype_known = true;
  }
  if (ds.parameter_order.size() != trainable.size())
    throw CheckpointError(path + ": param_shapes lists " + std::to_string(trainable.size()) + " parameters, the module " +
                          std::to_string(ds.parameter_order.size()) + " of them");
}

// One rank's optimizer file: its flat masters and states, in flat order.
struct RankOptimizer {
  std::vector<std::vector<char>> masters;
  std::vector<std::map<std::string, std::vector<char>>> states;
  std::vector<double> lrs;
  double step = 0;
  std::vector<std::map<std::string, std::pair<int64_t, int64_t>>> slices;  // per group: name -> (start, numel)
  const PickleValue* scaler = nullptr;
};

RankOptimizer read_rank_optimizer(const TorchArchive& a, const DsCheckpoint& ds, int rank) {
  const auto& path = a.path();
  const auto& osd = a.root().at("optimizer_state_dict", path);
  const bool z3 = ds.layout == DsLayout::zero3;
  if (const auto* pc = osd.find("partition_count")) {
    const int64_t count = pc->kind == PickleKind::integer ? pc->integer : pc->as_sequence(path).at(0)->as_int(path);
    if (count != ds.world)
      throw CheckpointError(path + ": partition_count " + std::to_string(count) + ", dp_world_size " + std::to_string(ds.world));
  }
  const auto& base = osd.at(z3 ? "optimizer_state_dict" : "base_optimizer_state", path);
  if (base.kind != PickleKind::dict)
    throw CheckpointError(path + ": base_optimizer_state is a " + kind_name(base.kind) +
                          " (elastic checkpoint format?); this importer reads the plain optimizer state_dict");
  RankOptimizer out;
  for (const auto& t : osd.at(z3 ? "fp32_flat_groups" : "single_partition_of_fp32_groups", path).as_sequence(path)) {
    const auto& ref = t->as_tensor(path + " fp32 partition");
    if (ref.storage.dtype != affine::DType::f32) throw CheckpointError(path + ": an fp32 partition of dtype " + describe(*t));
    out.masters.push_back(a.read(ref, "fp32 partition " + std::to_string(out.masters.size())));
  }
  int64_t index = 0;
  for (const auto& group : base.at("param_groups", path).as_sequence(path)) {
    out.lrs.push_back(group->at("lr", path).as_double(path + " lr"));
    for (const auto& p : group->at("params", path).as_sequence(path)) {
      const int64_t id = p->as_int(path);
      if (id != index++) throw CheckpointError(path + ": optimizer params out of order (" + std::to_string(id) + ")");
      const auto& state = base.at("state", path).at(id, path + " state");
      std::map<std::string, std::vector<char>> states;
      for (const auto& [key, value] : state.entries) {
        const auto& name = key->as_string(path);
        const auto what = name + " of flat group " + std::to_string(id);
        if (name == "step") {
          out.step = value->kind == PickleKind::tensor ? [&] {
            const auto b = a.read(value->tensor, what);
            if (value->tensor.storage.dtype == affine::DType::f32 && b.size() == 4) return double(*reinterpret_cast<const float*>(b.data()));
            throw CheckpointError(path + ": " + what + " is " + describe(*value) + " (a float32 scalar expected)");
          }() : value->as_double(path + " " + what);
          continue;
        }
        const auto& ref = value->as_tensor(path + " " + what);
        if (ref.storage.dtype != affine::DType::f32) throw CheckpointError(path + ": " + what + " is " + describe(*value));
        states[name] = a.read(ref, what);
      }
      out.states.push_back(std::move(states));
    }
  }
  if (out.states.size() != out.masters.size())
    throw CheckpointError(path + ": " + std::to_string(out.masters.size()) + " fp32 partitions, optimizer state for " +
                          std::to_string(out.states.size()));
  if (const auto* mappings = osd.find("param_slice_mappings"))
    for (const auto& group : mappings->as_sequence(path)) {
      out.slices.emplace_back();
      for (const auto& [name, f] : group->entries)
        out.slices.back()[name->as_string(path)] = {f->at("start", path).as_int(path), f->at("numel", path).as_int(path)};
    }
  out.scaler = osd.find("loss_scaler");
  (void)rank;
  return out;
}

// ZeRO-1/2: every group's partitions agree in size across ranks, cover the group, and match
// DeepSpeed's own slice table.
void check_zero12(const DsCheckpoint& ds, const std::vector<RankOptimizer>& ranks, const std::vector<std::string>& files) {
  for (size_t g = 0; g < ds.groups.size(); ++g) {
    const int64_t P = ds.groups[g].rank_elements(0);
    int64_t total = 0;
    for (const auto& p : ds.groups[g].parameters) total += p.elements();
    for (int r = 0; r < ds.world; ++r) {
      if (ds.groups[g].rank_elements(r) != P)
        throw CheckpointError(files[size_t(r)] + ": the fp32 partition of group " + std::to_string(g) + " has " +
                              std::to_string(ds.groups[g].rank_elements(r)) + " elements, rank 0's " + std::to_string(P));
      if (total > P * ds.world)
        throw CheckpointError(files[size_t(r)] + ": group " + std::to_string(g) + " has " + std::to_string(total) +
                              " elements, its " + std::to_string(ds.world) + " partitions " + std::to_string(P * ds.world));
      if (ranks[size_t(r)].slices.size() <= g) continue;
      std::map<std::string, std::pair<int64_t, int64_t>> expected;
      int64_t offset = 0;
      for (const auto& p : ds.groups[g].parameters) {
        const int64_t begin = std::max(offset, r * P), end = std::min(offset + p.elements(), (r + 1) * P);
        if (begin < end) expected[p.name] = {begin - r * P, end - begin};
        offset += p.elements();
      }
      if (expected != ranks[size_t(r)].slices[g])
        throw CheckpointError(files[size_t(r)] + ": param_slice_mappings of group " + std::to_string(g) +
                              " disagree with param_shapes' order and sizes (round_robin_gradients? another model?)");
    }
  }
}

// Moves the ranks' flat buffers into ds.groups (ZeRO-3: each rank's sub-groups as one flat group).
void assemble(DsCheckpoint& ds, std::vector<RankOptimizer>& ranks, const std::vector<std::string>& files) {
  if (ds.layout == DsLayout::zero3) {
    DsFlatGroup all;
    for (auto& g : ds.groups) all.parameters.insert(all.parameters.end(), g.parameters.begin(), g.parameters.end());
    ds.groups = {std::move(all)};
  }
  const size_t flats = ranks[0].masters.size();
  if (ds.layout == DsLayout::zero12 && flats != ds.groups.size())
    throw CheckpointError(files[0] + ": " + std::to_string(flats) + " fp32 partitions for " + std::to_string(ds.groups.size()) +
                          " parameter groups");
  for (const auto& [name, bytes] : ranks[0].states[0]) ds.state_names.push_back(name);
  for (int r = 0; r < ds.world; ++r) {
    auto& rank = ranks[size_t(r)];
    if (rank.masters.size() != flats)
      throw CheckpointError(files[size_t(r)] + ": " + std::to_string(rank.masters.size()) + " fp32 flat groups, rank 0 has " +
                            std::to_string(flats));
    if (rank.step != ranks[0].step)
      throw CheckpointError(files[size_t(r)] + ": optimizer step " + std::to_string(rank.step) + ", rank 0's " + std::to_string(ranks[0].step));
    for (size_t j = 0; j < flats; ++j) {
      const size_t g = ds.layout == DsLayout::zero3 ? 0 : j;
      auto& group = ds.groups[g];
      group.master.resize(size_t(ds.world));
      auto append = [](std::vector<char>& to, std::vector<char>& from) { to.insert(to.end(), from.begin(), from.end()); };
      append(group.master[size_t(r)], rank.masters[j]);
      for (const auto& name : ds.state_names) {
        const auto it = rank.states[j].find(name);
        if (it == rank.states[j].end() || rank.states[j].size() != ds.state_names.size() || it->second.size() != rank.masters[j].size())
          throw CheckpointError(files[size_t(r)] + ": flat group " + std::to_string(j) + ": optimizer state '" + name +
                                "' missing or not the size of its fp32 partition");
        group.states[name].resize(size_t(ds.world));
        append(group.states[name][size_t(r)], it->second);
      }
    }
  }
  if (ds.layout == DsLayout::zero12) return check_zero12(ds, ranks, files);
  int64_t partitions = 0;  // ZeRO-3: ceil(numel / W) of every tensor, on every rank
  for (const auto& p : ds.groups[0].parameters) partitions += (p.elements() + ds.world - 1) / ds.world;
  for (int r = 0; r < ds.world; ++r)
    if (ds.groups[0].rank_elements(r) < partitions)
      throw CheckpointError(files[size_t(r)] + ": fp32 flat groups of " + std::to_string(ds.groups[0].rank_elements(r)) +
                            " elements; the parameters' ZeRO-3 partitions need " + std::to_string(partitions));
}

}  // namespace

namespace detail {

int stage_of(const PickleValue& osd, const DsCheckpoint& ds) {
  if (const auto* z = osd.find("zero_stage")) return int(z->kind == PickleKind::enum_member ? z->integer : z->as_int("zero_stage"));
  const auto config = json::parse(ds.config_json);  // the bf16 optimizer does not say
  if (config.contains("zero_optimization") && config["zero_optimization"].contains("stage"))
    return config["zero_optimization"]["stage"].get<int>();
  return ds.layout == DsLayout::zero3 ? 3 : 1;
}

DsLossScaler loss_scaler_of(const PickleValue& s, const std::string& path) {
  DsLossScaler out;
  out.scale = s.at("cur_scale", path + " loss_scaler").as_double(path);
  out.dynamic = s.text.size() >= 17 && s.text.compare(s.text.size() - 17, 17, "DynamicLossScaler") == 0;
  if (!out.dynamic) return out;
  out.iteration = s.at("cur_iter", path).as_int(path);
  out.last_overflow_iteration = s.at("last_overflow_iter", path).as_int(path);
  if (const auto* h = s.find("cur_hysteresis")) out.hysteresis_left = h->as_int(path);
  return out;
}

}  // namespace detail

int64_t DsParameter::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool is_deepspeed_checkpoint(const std::string& dir, const std::string& tag) {
  std::error_code ec;
  std::string t = tag;
  if (t.empty()) {
    const auto latest = latest_file(dir);
    if (latest.empty()) return false;
    try {
      t = trimmed(read_text(latest.string()));
    } catch (const CheckpointError&) {
      return false;
    }
  }
  const auto tag_dir = fs::path(dir) / t;
  return !fs::exists(tag_dir / kManifestName, ec) && !model_states_file(tag_dir).empty();
}

}  // namespace tessera::checkpoint::deepspeed

namespace tessera::checkpoint::deepspeed {

DsCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag) {
  DsCheckpoint ds;
  ds.tag = resolve_tag(dir, tag);
  check_tag(ds.tag);
  const fs::path tag_dir = fs::path(dir) / ds.tag;
  ds.tag_dir = tag_dir.string();
  const auto model = model_states_file(tag_dir);
  if (model.empty())
    throw CheckpointError(ds.tag_dir + ": no mp_rank_00_model_states.pt or zero_pp_rank_0_mp_rank_00_model_states.pt "
                          "(not a DeepSpeed checkpoint tag)");
  ds.layout = fs::path(model).filename().string().rfind("zero_pp_rank_", 0) == 0 ? DsLayout::zero3 : DsLayout::zero12;
  read_model_states(ds, model);
  for (int r = 1; ds.layout == DsLayout::zero3 && !ds.frozen.empty() && r < ds.world; ++r) {
    const auto path = (tag_dir / ("zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_model_states.pt")).string();
    if (!fs::is_regular_file(path))
      throw CheckpointError(path + ": missing (it holds rank " + std::to_string(r) + "'s partition of the frozen parameters)");
    read_frozen_fragments(ds, TorchArchive(path), path);
  }
  finish_frozen(ds, model);
  if (is_universal_tag(ds.tag_dir)) {
    read_universal(ds);
    return ds;
  }
  // bf16 training names its optimizer files bf16_zero_pp_rank_*; fp32 and fp16 do not.
  const std::string prefix = fs::is_regular_file(tag_dir / "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt") ? "bf16_" : "";
  std::vector<RankOptimizer> ranks;
  std::vector<std::string> files;
  for (int r = 0; r < ds.world; ++r) {
    files.push_back((tag_dir / (prefix + "zero_pp_rank_" + std::to_string(r) + "_mp_rank_00_optim_states.pt")).string());
    if (!fs::is_regular_file(files.back()))
      throw CheckpointError(files.back() + ": missing (rank " + std::to_string(r) + " of dp_world_size " +
                            std::to_string(ds.world) + ")");
    TorchArchive a(files.back());
    ranks.push_back(read_rank_optimizer(a, ds, r));
    const auto* scaler = ranks.back().scaler;
    ranks.back().scaler = nullptr;  // it lives in the archive, closed at the end of this iteration
    if (r != 0) continue;
    const auto& osd = a.root().at("optimizer_state_dict", files.back());
    ds.stage = detail::stage_of(osd, ds);
    if (scaler && ds.dtype == affine::DType::f16) {
      ds.has_loss_scaler = true;
      ds.loss_scaler = detail::loss_scaler_of(*scaler, files.back());
    }
  }
  if (ds.world < 1) throw CheckpointError(model + ": dp_world_size " + std::to_string(ds.world));
  if ((ds.layout == DsLayout::zero3) != (ds.stage == 3))
    throw CheckpointError(files[0] + ": zero_stage " + std::to_string(ds.stage) + " with " +
                          (ds.layout == DsLayout::zero3 ? "ZeRO-3" : "ZeRO-1/2") + " file names");
  assemble(ds, ranks, files);
  ds.optimizer_step = int64_t(ranks[0].step);
  ds.group_lrs = ranks[0].lrs;
  return ds;
}

}  // namespace tessera::checkpoint::deepspeed
