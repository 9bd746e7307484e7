// Engine::save_16bit_model: the weights as a Hugging Face directory, each rank writing the bytes it
// stores (core/checkpoint/hf_export.h decides the layout and who writes what).
//
// Steps, every rank: (1) rank 0 creates the files under hidden temporary names, sized, with their
// headers; the ranks agree on the names and on any error. (2) Each rank pwrites its ranges and
// syncs; the ranks agree. (3) Rank 0 renames the files into place, writes the index and
// config.json atomically, syncs DIR; the ranks agree, so every rank returns (or raises the same
// error) once the export is complete. Files of an earlier export are set aside under hidden names
// first (set_aside_earlier_export) and removed in the background: shards the new export lacks
// disappear, and freeing a replaced file's blocks does not delay the return.
// A failure at any step removes the temporary files; a kill leaves at most hidden files, which the
// next export into DIR removes.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "actors/engine/checkpoint_support.h"
#include "actors/engine/engine_impl.h"
#include "core/affine/serialize.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/io/detail/posix_file.h"
#include "core/io/weight_directory.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using nlohmann::json;
using checkpoint_support::all_gather_strings;
using checkpoint_support::first_error;

// What one exported tensor comes from: a stored map (trainable) or a whole frozen tensor.
struct ExportSource {
  const StoredTensorMap* stored = nullptr;
  at::Tensor frozen;
};

std::string temp_name(const std::string& file, const std::string& nonce) { return "." + file + ".partial-" + nonce; }
std::string replaced_name(const std::string& file, const std::string& nonce) { return "." + file + ".replaced-" + nonce; }

// Runs `work`, returning its error message ("" on success) so the ranks can agree on it.
template <class Work>
std::string attempt(Work&& work) {
  try {
    work();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

void agree(transport::Communicator* comm, const std::string& dir, const std::string& error) {
  if (auto e = first_error(all_gather_strings(comm, error)); !e.empty())
    throw CheckpointError("save_16bit_model " + dir + ": " + e);
}

// Hidden leftovers of exports: temporary files of one that was killed, replaced files not yet removed.
bool is_export_leftover(const std::string& name) {
  return name.rfind(".model", 0) == 0 &&
         (name.find(".partial-") != std::string::npos || name.find(".replaced-") != std::string::npos);
}

// Rank 0, before the renames: every file of an earlier export gets a hidden second name (a new one
// that replaces it keeps its blocks alive there; one the new export lacks is renamed to it), so
// the commit frees no blocks and the hidden files are removed in the background. At every point
// the directory holds the old file or the new one under each name.
std::vector<fs::path> set_aside_earlier_export(const std::string& dir, const std::vector<std::string>& kept,
                                               const std::string& nonce) {
  const std::set<std::string> keep(kept.begin(), kept.end());
  std::vector<fs::path> aside;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const auto name = entry.path().filename().string();
    if (!io::is_weight_file_name(name) || !entry.is_regular_file()) continue;
    const auto hidden = fs::path(dir) / replaced_name(name, nonce);
    if (keep.count(name)) fs::create_hard_link(entry.path(), hidden);
    else fs::rename(entry.path(), hidden);
    aside.push_back(hidden);
  }
  return aside;
}

// Not those a BackgroundRemoval has queued already (`skip`).
void remove_leftovers(const std::string& dir, const std::set<std::string>& skip) {
  std::set<std::string> skipped;
  for (const auto& p : skip) skipped.insert(fs::path(p).lexically_normal().string());
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(dir, ignored))
    if (is_export_leftover(entry.path().filename().string()) && !skipped.count(entry.path().lexically_normal().string()))
      fs::remove(entry.path(), ignored);
}

}  // namespace

ModelExported Engine::save_16bit_model(const std::string& dir, const Save16BitOptions& options) {
  auto& s = *impl_;
  s.rethrow_pending();
  s.require_resident("save_16bit_model");
  auto* comm = s.control_comm();
  const int rank = s.spec->rank, world = s.spec->world;
  const auto storage = storage_maps();

  // The tensors in model order: trainable ones from their maps, frozen ones whole (every rank has them).
  std::map<std::string, const StoredTensorMap*> stored;
  for (const auto& m : storage.maps)
    if (m.kind == "param") stored.emplace(m.map.name, &m);
  std::vector<checkpoint::OutputTensor> tensors;
  std::vector<ExportSource> sources;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : s.module->named_parameters()) {
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;  // tied: once, first name
    if (auto found = stored.find(item.key()); found != stored.end()) {
      const auto& map = found->second->map;
      tensors.push_back({item.key(), map.dtype, map.shape});
      sources.push_back({found->second, {}});
    } else if (!item.value().requires_grad() && !options.exclude_frozen_parameters) {
      const auto t = item.value().detach();
      tensors.push_back({item.key(), affine_dtype(t.scalar_type()), affine::Dims(t.sizes().vec())});
      sources.push_back({nullptr, t});
    }
  }
  const auto layout = checkpoint::plan_export(tensors, options.max_shard_bytes, {{"format", "pt"}});

  // (1) Rank 0 creates the files.
  std::string nonce, error;
  if (rank == 0) {
    nonce = checkpoint_support::nonce();
    error = attempt([&] {
      fs::create_directories(dir);
      remove_leftovers(dir, s.removal->pending());
      for (const auto& f : layout.files)
        checkpoint::create_export_file((fs::path(dir) / temp_name(f.name, nonce)).string(), f, options.fill_for_testing);
    });
  }
  const auto hello = all_gather_strings(comm, json{{"nonce", nonce}, {"error", error}}.dump());
  auto remove_temps = [&] {
    if (rank != 0) return;
    std::error_code ignored;
    for (const auto& f : layout.files) fs::remove(fs::path(dir) / temp_name(f.name, nonce), ignored);
  };
  {
    std::vector<std::string> errors;
    for (const auto& h : hello) errors.push_back(json::parse(h)["error"].get<std::string>());
    if (auto e = first_error(errors); !e.empty()) {
      remove_temps();
      throw CheckpointError("save_16bit_model " + dir + ": " + e);
    }
  }
  nonce = json::parse(hello[0])["nonce"].get<std::string>();

  // (2) Every rank writes what it holds.
  ModelExported result;
  error = attempt([&] {
    std::vector<std::vector<std::pair<const char*, checkpoint::ExportWrite>>> by_file(layout.files.size());
    std::vector<at::Tensor> hosts;  // host copies of device buffers, alive until written
    for (size_t t = 0; t < tensors.size(); ++t) {
      const int file = layout.file_of[t];
      if (!sources[t].stored) {  // frozen: rank 0 writes it whole
        if (rank != 0) continue;
        hosts.push_back(sources[t].frozen.cpu().contiguous());
        by_file[size_t(file)].push_back({static_cast<const char*>(hosts.back().data_ptr()),
                                         {file, layout.offset_of[t], 0, tensors[t].bytes()}});
        continue;
      }
      const auto& m = *sources[t].stored;
      auto buffer = storage.buffers.at(m.buffer);
      if (!buffer.device().is_cpu()) hosts.push_back(buffer = buffer.cpu());
      const auto* base = static_cast<const char*>(buffer.data_ptr());
      for (const auto& w : checkpoint::export_writes(m.map, layout, file, layout.offset_of[t], rank, world))
        by_file[size_t(file)].push_back({base, w});
    }
    for (size_t f = 0; f < layout.files.size(); ++f) {
      if (by_file[f].empty()) continue;
      checkpoint::PositionalWriter out((fs::path(dir) / temp_name(layout.files[f].name, nonce)).string());
      for (const auto& [base, w] : by_file[f]) {
        out.write_at(base + w.buffer_offset, w.bytes, w.file_offset);
        result.bytes_written += w.bytes;
      }
      out.sync_and_close();
    }
  });
  if (auto e = first_error(all_gather_strings(comm, error)); !e.empty()) {
    remove_temps();
    throw CheckpointError("save_16bit_model " + dir + ": " + e);
  }

  // (3) Rank 0 commits.
  for (const auto& f : layout.files) result.files.push_back(f.name);
  if (!layout.index_name.empty()) result.files.push_back(layout.index_name);
  if (!options.config_json.empty()) result.files.push_back("config.json");
  error = "";
  std::vector<fs::path> aside;
  if (rank == 0) {
    error = attempt([&] {
      aside = set_aside_earlier_export(dir, result.files, nonce);
      for (const auto& f : layout.files) fs::rename(fs::path(dir) / temp_name(f.name, nonce), fs::path(dir) / f.name);
      using io::detail::ByteSpan;
      if (!layout.index_name.empty())
        io::detail::write_file_atomically((fs::path(dir) / layout.index_name).string(),
                                          {ByteSpan{layout.index_json.data(), layout.index_json.size()}});
      if (!options.config_json.empty())
        io::detail::write_file_atomically((fs::path(dir) / "config.json").string(),
                                          {ByteSpan{options.config_json.data(), options.config_json.size()}});
      checkpoint::fsync_path(dir);
    });
    if (!error.empty()) remove_temps();
    else {
      std::vector<std::string> paths;
      for (const auto& path : aside) paths.push_back(path.string());
      s.removal->remove(std::move(paths));
    }
  }
  agree(comm, dir, error);
  return result;
}

}  // namespace tessera
