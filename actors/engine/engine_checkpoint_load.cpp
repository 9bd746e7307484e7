// Engine::load_checkpoint: plans every stored tensor from the checkpoint's maps (its "ranks" are
// the rank files) into this engine's maps, whatever the layout either was saved or is run at; reads
// only the chunks of each file the plans touch (positional reads), verifies each against its hash,
// agrees with every rank that all is well, and only then writes the engine's buffers and counters.
// A DeepSpeed ZeRO checkpoint (DIR/latest, or DIR/latest_universal for DeepSpeed's universal format,
// naming a tag with DeepSpeed's model-states file, no manifest) is first imported (core/checkpoint/deepspeed/import.h) by rank 0 into a temporary
// tessera checkpoint under the system's temp directory, whose path every rank receives; a rank that
// cannot see it (another node without that directory) imports its own copy. That checkpoint is
// loaded as any other and removed afterwards.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <set>

#include "actors/ask.h"
#include "actors/engine/checkpoint_support.h"
#include "actors/engine/engine_impl.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/deepspeed/ds_checkpoint.h"
#include "core/checkpoint/deepspeed/import.h"
#include "core/checkpoint/manifest.h"
#include "core/io/detail/posix_file.h"
#include "core/io/huge_page_buffer.h"
#include "core/log/log.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using namespace checkpoint_support;

// One saved buffer this rank reads: the chunks the plans touch, in a lazily backed tensor.
struct SourceBuffer {
  const checkpoint::RankFile* file = nullptr;
  const checkpoint::SavedBuffer* buffer = nullptr;
  std::set<int64_t> chunks;
  at::Tensor data;
};

struct LoadPlan {
  std::vector<affine::Plan> plans;                 // one per tensor this rank receives
  std::vector<std::string> target_keys;            // the engine buffer each plan writes
  std::vector<std::map<int, std::string>> source_keys;  // per plan: file rank -> buffer key
  std::map<std::pair<int, std::string>, SourceBuffer> sources;
  // Frozen parameters: the model's tensor and the source buffer (file rank, key) it is read from whole.
  std::vector<std::pair<at::Tensor, std::pair<int, std::string>>> frozen;
};

void check_identity(const checkpoint::Manifest& m, const Engine::Impl& s, const std::string& where) {
  if (m.tp_size != 1)
    throw CheckpointError(where + ": saved at tensor-parallel size " + std::to_string(m.tp_size) +
                          "; this build loads tensor-parallel size 1 only");
  auto params = s.module->named_parameters();
  if (m.parameters.size() != s.names.size())
    throw CheckpointError(where + ": saved from a model of " + std::to_string(m.parameters.size()) +
                          " trainable parameters, this model has " + std::to_string(s.names.size()));
  for (size_t i = 0; i < s.names.size(); ++i) {
    const auto& saved = m.parameters[i];
    const auto& p = params[s.names[i]];
    const affine::Dims shape(p.sizes().vec());
    if (saved.name != s.names[i])
      throw CheckpointError(where + ": parameter " + std::to_string(i) + " is '" + saved.name + "' there, '" + s.names[i] +
                            "' in this model (another model?)");
    if (!(saved.shape == shape) || saved.dtype != affine_dtype(p.scalar_type()))
      throw CheckpointError(where + ": tensor '" + saved.name + "' is " + affine::dtype_name(saved.dtype) + " " +
                            affine::to_string(saved.shape) + " there, " + affine::dtype_name(affine_dtype(p.scalar_type())) + " " +
                            affine::to_string(shape) + " in this model");
  }
}

// Plans every tensor of `kinds` into this rank's buffers (aliases skipped: their base is loaded).
LoadPlan plan_load(const checkpoint::Manifest& m, const EngineStorage& storage, const std::set<std::string>& kinds,
                   int rank, const std::string& where) {
  std::map<std::pair<std::string, std::string>, const checkpoint::SavedMap*> saved;
  for (const auto& sm : m.maps) saved[{sm.kind, sm.map.name}] = &sm;
  const auto aliases = find_aliases(storage);
  LoadPlan out;
  for (const auto& target : storage.maps) {
    if (!kinds.count(target.kind) || aliases.count(target.buffer)) continue;
    const auto mine = target.map.ranks.find(rank);
    if (mine == target.map.ranks.end() || mine->second.pieces.empty()) continue;
    const auto it = saved.find({target.kind, target.map.name});
    if (it == saved.end())
      throw CheckpointError(where + ": holds no '" + target.kind + "' of tensor '" + target.map.name +
                            "' (saved with another optimizer or precision? it holds: " + [&] {
                              std::string k;
                              for (const auto& kind : m.kinds) k += (k.empty() ? "" : ", ") + kind;
                              return k;
                            }() + ")");
    const auto& source = *it->second;
    if (source.map.dtype != target.map.dtype)
      throw CheckpointError(where + ": '" + target.kind + "' of tensor '" + target.map.name + "' is " +
                            affine::dtype_name(source.map.dtype) + " there, " + affine::dtype_name(target.map.dtype) + " here");
    // The planner plans whole tensors (every target rank); this rank runs its own segments.
    auto whole = affine::plan(target.map, source.map);
    whole.segments.erase(std::remove_if(whole.segments.begin(), whole.segments.end(),
                                        [rank](const affine::Segment& seg) { return seg.target_rank != rank; }),
                         whole.segments.end());
    out.plans.push_back(std::move(whole));
    out.target_keys.push_back(target.buffer);
    out.source_keys.push_back(source.buffers);
    for (const auto& seg : out.plans.back().segments) {
      const auto& key = source.buffers.at(seg.source_rank);
      auto& src = out.sources[{seg.source_rank, key}];
      if (!src.file) {
        src.file = &m.file_of_rank(seg.source_rank);
        src.buffer = src.file->find(key);
        if (!src.buffer)
          throw CheckpointError(where + ": the map of '" + target.map.name + "' names buffer '" + key + "' of " +
                                src.file->file + ", which the manifest does not list");
      }
      const int64_t es = affine::element_size(src.buffer->dtype);
      int64_t last = seg.source_offset;
      for (int k = 0; k < seg.shape.size(); ++k) last += (seg.shape[k] - 1) * seg.source_strides[k];
      if (seg.source_offset < 0 || last >= src.buffer->elements)
        throw CheckpointError(where + ": tensor '" + target.map.name + "' reaches outside buffer '" + key + "' of " + src.file->file);
      for (int64_t c = seg.source_offset * es / src.buffer->chunk_bytes; c <= ((last + 1) * es - 1) / src.buffer->chunk_bytes; ++c)
        src.chunks.insert(c);
    }
  }
  return out;
}

// The model's frozen parameters against the checkpoint's: each read whole from its file (every
// chunk verified) and copied in with the buffers. One the model has and the checkpoint lacks, or the
// other way round, or of another dtype or shape, is an error naming it; a checkpoint written before
// frozen parameters were saved leaves the model's as they are, saying so.
void plan_frozen(const checkpoint::Manifest& m, const Engine::Impl& s, LoadPlan& plan, const std::string& where) {
  const auto mine = frozen_parameters(*s.module, s.names);
  if (!m.frozen_recorded) {
    if (!mine.empty() && s.spec->rank == 0)
      log::warn(where + ": written before frozen parameters were saved; the model's " + std::to_string(mine.size()) +
                " frozen parameter(s) (" + mine.front().first + ", ...) keep their values");
    return;
  }
  std::map<std::string, const checkpoint::FrozenTensor*> saved;
  for (const auto& f : m.frozen) saved[f.name] = &f;
  for (const auto& [name, p] : mine) {
    const auto it = saved.find(name);
    if (it == saved.end())
      throw CheckpointError(where + ": holds no frozen parameter '" + name + "' (requires_grad false in this model; "
                            "saved from another model, or trained there?)");
    const auto& f = *it->second;
    const affine::Dims shape(p.sizes().vec());
    if (f.dtype != affine_dtype(p.scalar_type()) || !(f.shape == shape))
      throw CheckpointError(where + ": frozen parameter '" + name + "' is " + affine::dtype_name(f.dtype) + " " +
                            affine::to_string(f.shape) + " there, " + affine::dtype_name(affine_dtype(p.scalar_type())) +
                            " " + affine::to_string(shape) + " in this model");
    auto& src = plan.sources[{f.file, f.buffer}];
    src.file = &m.file_of_rank(f.file);
    src.buffer = src.file->find(f.buffer);
    const int64_t bytes = src.buffer->elements * affine::element_size(src.buffer->dtype);
    for (int64_t c = 0; c * src.buffer->chunk_bytes < bytes; ++c) src.chunks.insert(c);
    plan.frozen.push_back({p, {f.file, f.buffer}});
    saved.erase(it);
  }
  if (!saved.empty())
    throw CheckpointError(where + ": holds frozen parameter '" + saved.begin()->first +
                          "', which this model does not have as a frozen parameter (another model?)");
}

// Copies the frozen parameters read (plan_frozen) into the model's tensors.
void load_frozen(const LoadPlan& plan) {
  c10::AutoGradMode no_grad(false);
  for (const auto& [target, id] : plan.frozen) target.copy_(plan.sources.at(id).data.view(target.sizes()));
}

// Reads and verifies every chunk the plans touch, asking the kernel kReadAhead ahead within each
// run of consecutive chunks so that the disk reads while the chunks before are hashed.
constexpr int64_t kReadAhead = int64_t{64} << 20;

void read_sources(LoadPlan& plan, const std::string& tag_dir) {
  std::map<std::string, std::unique_ptr<io::detail::ReadOnlyFile>> open;
  for (auto& [id, src] : plan.sources) {
    const auto path = (fs::path(tag_dir) / src.file->file).string();
    auto& file = open[path];
    if (!file) {
      if (!fs::is_regular_file(path)) throw CheckpointError(path + ": missing (or not a regular file)");
      file = std::make_unique<io::detail::ReadOnlyFile>(path);
      if (int64_t(file->size_bytes()) != src.file->bytes)
        throw CheckpointError(path + ": " + std::to_string(file->size_bytes()) + " bytes, the manifest says " +
                              std::to_string(src.file->bytes) + " (truncated or replaced)");
    }
    const auto& b = *src.buffer;
    src.data = io::huge_page_empty(b.elements, scalar_type(b.dtype));  // pages touched by reads only, 2 MiB each
    const int64_t bytes = b.elements * affine::element_size(b.dtype);
    auto* base = static_cast<char*>(src.data.data_ptr());
    int64_t run_end = 0, prefetched = 0;  // the current run of consecutive chunks ends at run_end
    for (auto it = src.chunks.begin(); it != src.chunks.end(); ++it) {
      const int64_t c = *it;
      const int64_t begin = c * b.chunk_bytes, n = std::min(b.chunk_bytes, bytes - begin);
      if (begin >= run_end) {  // a new run: find its end
        auto last = it;
        while (std::next(last) != src.chunks.end() && *std::next(last) == *last + 1) ++last;
        run_end = std::min(bytes, (*last + 1) * b.chunk_bytes);
        prefetched = begin;
      }
      if (const int64_t want = std::min(run_end, begin + kReadAhead); want > prefetched) {
        file->prefetch(uint64_t(b.data_offset + prefetched), uint64_t(want - prefetched));
        prefetched = want;
      }
      file->pread_exact(base + begin, uint64_t(n), uint64_t(b.data_offset + begin), "buffer '" + b.key + "'");
      if (checkpoint::xxh3(base + begin, size_t(n)) != b.chunk_hashes.at(size_t(c)))
        throw CheckpointError(path + ": buffer '" + b.key + "' bytes [" + std::to_string(begin) + ", " +
                              std::to_string(begin + n) + ") do not match their hash (corrupted)");
    }
  }
}

// Elements of the written buffers that no map of this rank covers (ZeRO padding) become zero, as
// a fresh engine has them: the loaded state is then the saved one in every byte.
void zero_uncovered(const LoadPlan& plan, const EngineStorage& storage, int rank) {
  std::set<std::string> written(plan.target_keys.begin(), plan.target_keys.end());
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> covered;  // [begin, end) runs
  for (const auto& m : storage.maps) {
    if (!written.count(m.buffer)) continue;
    const auto mine = m.map.ranks.find(rank);
    if (mine == m.map.ranks.end()) continue;
    for (const auto& piece : mine->second.pieces) {
      if (piece.box.is_empty()) continue;
      bool dense = true;  // row-major without gaps: one run
      int64_t expected = 1;
      for (int k = piece.box.ndim() - 1; k >= 0; --k) {
        dense = dense && (piece.box.shape[k] == 1 || piece.strides[k] == expected);
        expected *= piece.box.shape[k];
      }
      if (dense) {
        covered[m.buffer].push_back({piece.offset, piece.offset + piece.box.volume()});
        continue;
      }
      affine::Dims i = piece.box.origin;
      for (;;) {  // strided: element by element (engines' flat buffers never are)
        const int64_t a = piece.address_of(i);
        covered[m.buffer].push_back({a, a + 1});
        int k = piece.box.ndim() - 1;
        while (k >= 0 && ++i[k] == piece.box.end(k)) i[k] = piece.box.origin[k], --k;
        if (k < 0) break;
      }
    }
  }
  c10::AutoGradMode no_grad(false);
  for (const auto& key : written) {
    auto runs = covered[key];
    std::sort(runs.begin(), runs.end());
    auto flat = storage.buffers.at(key).view({-1});
    int64_t at = 0;
    for (const auto& [begin, end] : runs) {
      if (begin > at) flat.narrow(0, at, begin - at).zero_();
      at = std::max(at, end);
    }
    if (flat.numel() > at) flat.narrow(0, at, flat.numel() - at).zero_();
  }
}

void execute(const LoadPlan& plan, const EngineStorage& storage, int rank) {
  std::vector<affine::LocalTransfer> batch;
  for (size_t i = 0; i < plan.plans.size(); ++i) {
    affine::LocalTransfer t;
    t.plan = &plan.plans[i];
    for (const auto& [file_rank, key] : plan.source_keys[i]) {
      const auto it = plan.sources.find({file_rank, key});
      if (it == plan.sources.end()) continue;  // a file this plan takes nothing from
      const auto& d = it->second.data;
      t.source_buffers[file_rank] = {d.data_ptr(), d.numel(), affine_dtype(d.scalar_type())};
    }
    const auto& target = storage.buffers.at(plan.target_keys[i]);
    t.target_buffers[rank] = {target.data_ptr(), target.numel(), affine_dtype(target.scalar_type())};
    batch.push_back(std::move(t));
  }
  affine::execute_local(batch);
}

// A temporary tessera checkpoint imported from a DeepSpeed one; removed with this object.
class ImportedDeepSpeed {
 public:
  ImportedDeepSpeed(transport::Communicator* comm, int rank, const std::string& dir, const std::string& tag) {
    std::string error;
    if (rank == 0) error = import_into(unique_dir(), dir, tag);
    const auto paths = all_gather_strings(comm, nlohmann::json{{"root", root_}, {"error", error}}.dump());
    const auto first = nlohmann::json::parse(paths[0]);
    std::vector<std::string> errors{first["error"].get<std::string>()};
    if (auto e = first_error(errors); !e.empty()) throw CheckpointError("load_checkpoint " + dir + ": import of the DeepSpeed checkpoint failed: " + e);
    const std::string shared = first["root"].get<std::string>();
    if (rank != 0 && !fs::is_directory(shared)) {
      if (auto e = import_into(unique_dir(), dir, tag); !e.empty()) throw CheckpointError("load_checkpoint " + dir + ": " + e);
    } else {
      root_ = rank == 0 ? root_ : shared;
      owner_ = rank == 0;
    }
  }
  ~ImportedDeepSpeed() {
    std::error_code ec;
    if (owner_) fs::remove_all(root_, ec);
  }
  const std::string& root() const { return root_; }
  const std::string& tag() const { return tag_; }

 private:
  static std::string unique_dir() {
    std::random_device device;
    return (fs::temp_directory_path() / ("tessera_ds_import_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(uint64_t(device()) << 32 | device())))
        .string();
  }
  std::string import_into(const std::string& root, const std::string& dir, const std::string& tag) {
    try {
      checkpoint::deepspeed::ImportOptions options;
      options.tag = tag;
      tag_ = checkpoint::deepspeed::import_deepspeed(dir, root, options).tag;
      root_ = root, owner_ = true;
      return "";
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  std::string root_, tag_;
  bool owner_ = false;
};

}  // namespace

CheckpointLoaded Engine::load_checkpoint(const std::string& dir, const CheckpointLoadOptions& options) {
  auto& s = *impl_;
  s.require_resident("load_checkpoint");
  if (s.update_started)  // a broken update is what a checkpoint loads over; one in progress is not
    s.refuse_during_update("load_checkpoint");
  if (checkpoint::deepspeed::is_deepspeed_checkpoint(dir, options.tag)) {
    s.rethrow_pending();
    wait_for_checkpoint();
    const ImportedDeepSpeed imported(s.control_comm(), s.spec->rank, dir, options.tag);
    auto inner = options;
    inner.tag = checkpoint::read_latest(imported.root());
    auto loaded = load_checkpoint(imported.root(), inner);  // every rank has read what it needs on return
    loaded.path = (fs::path(dir) / loaded.tag).string();
    return loaded;
  }
  s.rethrow_pending();
  wait_for_checkpoint();  // an asynchronous save in flight commits first (or raises here)
  for (const auto& g : s.groups)
    if (g.client_step && !options.load_module_only)
      throw CheckpointError("load_checkpoint: the client optimizer (" + g.client_class +
                            ") keeps its own state outside tessera's buffers; load with load_module_only, or use Adam, "
                            "AdamW, SGD, Adagrad or the config's optimizer");
  if (!s.micro->at_batch_start())
    throw CheckpointError("load_checkpoint: called inside a batch (micro-step " + std::to_string(s.micro->micro()) +
                          "): load between step() and the next backward");
  auto* comm = s.control_comm();
  const int rank = s.spec->rank;
  const bool optimizer_states = options.load_optimizer_states && !options.load_module_only && !s.inference;

  // 1. Read, check and plan; verify every chunk this rank uses. Nothing changes yet.
  CheckpointLoaded loaded;
  checkpoint::Manifest m;
  LoadPlan plan;
  EngineStorage storage;
  std::string error;
  try {
    loaded.tag = options.tag.empty() ? checkpoint::read_latest(dir) : options.tag;
    checkpoint::check_tag(loaded.tag);
    loaded.path = (fs::path(dir) / loaded.tag).string();
    const auto manifest_path = (fs::path(loaded.path) / checkpoint::kManifestName).string();
    if (!fs::is_regular_file(manifest_path))
      throw CheckpointError(loaded.path + ": no " + checkpoint::kManifestName + ": not a committed checkpoint");
    m = checkpoint::manifest_from_json(checkpoint::read_text(manifest_path), manifest_path);
    check_identity(m, s, manifest_path);
    std::set<std::string> kinds{"param"};
    if (optimizer_states)
      for (const auto& k : m.kinds) kinds.insert(k);
    storage = storage_maps();
    if (optimizer_states)  // every state this engine keeps must be there
      for (const auto& t : storage.maps) kinds.insert(t.kind);
    plan = plan_load(m, storage, kinds, rank, manifest_path);
    plan_frozen(m, s, plan, manifest_path);
    read_sources(plan, loaded.path);
    loaded.client_state = m.client_state;
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto failure = first_error(all_gather_strings(comm, error));
  if (!failure.empty()) throw CheckpointError("load_checkpoint " + dir + ": nothing was loaded: " + failure);

  // 2. Write: buffers, then what depends on them, then the counters.
  if (s.stage3) s.stage3->release_all();  // no gathered copy outlives the partitions it came from
  execute(plan, storage, rank);
  zero_uncovered(plan, storage, rank);
  load_frozen(plan);
  plan.sources.clear();
  // ZeRO-3: the weights' maps hold a persistent parameter whole in the gathered persistent segment
  // (loaded above), not its pieces in the partition: those come from the loaded copy, as a
  // modifier rank's write-back does (every rank loaded the same values; rank 0's are broadcast).
  if (s.stage3)
    actors::checked(actors::ask<actors::Done>(s.parameter_shard, s.bound(), "load_checkpoint: the parameter-shard",
                                              actors::writeback_atom::value,
                                              actors::WritebackRequest{{}, actors::PersistentCopies::include, 0}));
  if (!s.inference && !optimizer_states) {  // fp32 masters from the loaded weights
    actors::RefreshRequest all;
    const auto& groups = s.spec->plan->groups();
    for (size_t g = 0; g < groups.size(); ++g) all.ranges.push_back({int64_t(g), 0, groups[g].layout.partition_numel});
    actors::checked(actors::ask<actors::Done>(s.optimizer_shard, s.bound(), "load_checkpoint: the optimizer-shard",
                                              actors::refresh_atom::value, all));
  }
  if (options.load_module_only) return loaded;
  const auto& c = m.engine;
  const int64_t position = s.last_batch_iteration();
  s.global = c.global_steps, s.skipped = c.skipped_steps;
  s.micro->restore(c.micro_steps);
  s.last_lrs = c.last_lrs;
  if (s.scaler && c.has_loss_scaler) s.scaler->restore(c.loss_scaler);
  for (size_t g = 0; g < s.groups.size() && g < c.group_lrs.size(); ++g) {
    s.groups[g].options.lr = c.group_lrs[g];
    s.schedules[g] = optim::LrSchedule(actors::group_schedule(s.settings, s.groups[g].options));
  }
  if (!options.load_lr_scheduler_states) s.settings.schedule_offset += position - s.last_batch_iteration();
  if (optimizer_states)
    actors::checked(actors::ask<actors::Done>(s.optimizer_shard, s.bound(), "load_checkpoint: the optimizer-shard",
                                              actors::restore_atom::value, actors::OptimizerCounters{c.optimizer_updates}));
  return loaded;
}

}  // namespace tessera
