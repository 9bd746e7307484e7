// Engine::save_checkpoint: every rank writes the buffers it stores (core/checkpoint/save_layout.h
// says which) into one safetensors file of a partial directory and reports it; rank 0 writes the
// manifest and commits the directory (core/checkpoint/checkpoint_dir.h). Any rank's failure is
// every rank's CheckpointError, and the partial directory is removed.
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <random>

#include "actors/actor_runtime.h"
#include "actors/ask.h"
#include "actors/engine/checkpoint_support.h"
#include "actors/engine/engine_impl.h"
#include "core/affine/serialize.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/manifest.h"
#include "core/config/write.h"
#include "core/io/safetensors.h"
#include "core/log/log.h"
#include "core/io/detail/posix_file.h"
#include "transport/communicator.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using nlohmann::json;
using namespace checkpoint_support;

std::string nonce() {
  std::random_device device;
  std::mt19937_64 generator((uint64_t(device()) << 32) ^ device() ^
                            uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  return affine::hex_digest(generator()).substr(0, 12);
}

// Writes this rank's buffers to `path`; returns the file's entry.
checkpoint::RankFile write_rank_file(const std::string& path, int rank, const EngineStorage& storage,
                                     const checkpoint::SaveLayout& layout, const checkpoint::RankAliases& aliases) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& [key, t] : storage.buffers) {
    if (!t.defined()) continue;
    const auto range = layout.written_range(rank, key, t.numel(), aliases);
    if (range) tensors.push_back({key, t.reshape({t.numel()}).narrow(0, range->first, range->second - range->first)});
  }
  io::write_safetensors(path, tensors, {{"format", "tessera.checkpoint.rank"}, {"rank", std::to_string(rank)}});
  const io::SafetensorsFile file(path);
  checkpoint::RankFile entry;
  entry.rank = rank;
  entry.file = fs::path(path).filename().string();
  entry.bytes = int64_t(fs::file_size(path));
  entry.hash = checkpoint::hash_file(path);
  for (const auto& [key, t] : tensors) {
    checkpoint::SavedBuffer b;
    b.key = key;
    b.dtype = affine_dtype(t.scalar_type());
    b.elements = t.numel();
    b.data_offset = int64_t(8 + file.header().header_bytes + file.info(key).begin);  // from the file's start
    b.chunk_bytes = checkpoint::kChunkBytes;
    b.chunk_hashes = checkpoint::chunk_hashes(t.data_ptr(), t.numel() * int64_t(t.element_size()), b.chunk_bytes);
    entry.buffers.push_back(std::move(b));
  }
  return entry;
}

json aliases_json(const checkpoint::RankAliases& aliases) {
  json out = json::object();
  for (const auto& [key, a] : aliases) out[key] = {{"of", a.of}, {"offset", a.offset}};
  return out;
}

checkpoint::RankAliases aliases_from(const json& j) {
  checkpoint::RankAliases out;
  for (const auto& [key, a] : j.items()) out[key] = {a.at("of").get<std::string>(), a.at("offset").get<int64_t>()};
  return out;
}

checkpoint::EngineCounters counters(const Engine::Impl& s, int64_t optimizer_updates) {
  checkpoint::EngineCounters c;
  c.global_steps = s.global, c.skipped_steps = s.skipped, c.micro_steps = s.micro->micro();
  c.optimizer_updates = optimizer_updates;
  for (const auto& g : s.groups) c.group_lrs.push_back(g.options.lr);
  c.last_lrs = s.last_lrs;
  if (s.scaler) {
    const auto snap = s.scaler->snapshot();
    c.has_loss_scaler = true;
    c.loss_scaler = {snap.scale, snap.iteration, snap.last_overflow_iteration, snap.hysteresis_left, snap.skipped_steps};
  }
  return c;
}

// [tessera.checkpoint] keep_last: the oldest tags beyond the newest N go, never the one just
// saved or the one `latest` names. The save is committed already: a failure here is a warning.
void keep_last(const std::string& dir, const std::string& saved, int64_t keep) {
  if (keep <= 0) return;
  try {
    auto tags = checkpoint::committed_tags(dir);
    std::string latest;
    try {
      latest = checkpoint::read_latest(dir);
    } catch (const CheckpointError&) {
    }
    for (size_t i = 0; i + size_t(keep) < tags.size(); ++i)
      if (tags[i] != saved && tags[i] != latest) checkpoint::remove_tag(dir, tags[i]);
  } catch (const std::exception& e) {
    log::warn(std::string("save_checkpoint: keep_last: ") + e.what());
  }
}

}  // namespace

std::string Engine::save_checkpoint(const std::string& dir, const CheckpointSaveOptions& options) {
  auto& s = *impl_;
  s.rethrow_pending();
  for (const auto& g : s.groups)
    if (g.client_step)
      throw CheckpointError("save_checkpoint: the client optimizer keeps its own state outside tessera's buffers; "
                            "checkpoints of untranslated client optimizers are not supported yet (use Adam, AdamW, SGD "
                            "or Adagrad, or the config's optimizer)");
  if (!s.micro->at_batch_start())
    throw CheckpointError("save_checkpoint: called inside a batch (micro-step " + std::to_string(s.micro->micro()) +
                          "): save after step() at an accumulation boundary, before the next backward");
  const std::string tag = options.tag.empty() ? "global_step" + std::to_string(s.global) : options.tag;
  checkpoint::check_tag(tag);
  json client;
  try {
    client = json::parse(options.client_state);
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("save_checkpoint: client_state is not JSON: ") + e.what());
  }
  if (!client.is_object()) throw CheckpointError("save_checkpoint: client_state must be a JSON object");
  auto* comm = s.control_comm();
  const int rank = s.spec->rank, world = s.spec->world;
  auto reached = [&](SavePoint point) {
    if (options.at_point_for_testing) options.at_point_for_testing(point);
  };

  // 1. Agree on the tag and the partial directory (rank 0's nonce); rank 0 clears leftovers first.
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(dir);
      checkpoint::remove_partials(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const auto hello = all_gather_strings(comm, json{{"tag", tag}, {"nonce", nonce()}, {"error", error}}.dump());
  std::vector<std::string> errors;
  for (size_t r = 0; r < hello.size(); ++r) {
    const auto h = json::parse(hello[r]);
    errors.push_back(h["error"].get<std::string>());
    if (h["tag"] != tag) errors.back() = "saves tag '" + h["tag"].get<std::string>() + "', rank " + std::to_string(rank) + " '" + tag + "'";
  }
  if (auto e = first_error(errors); !e.empty()) throw CheckpointError("save_checkpoint " + dir + ": " + e);
  const std::string partial = checkpoint::partial_dir(dir, tag, json::parse(hello[0])["nonce"].get<std::string>());

  // 2. Every rank writes its file.
  const auto storage = storage_maps();
  const auto maps = engine_maps(storage);
  const checkpoint::SaveLayout layout(maps, world);
  const auto aliases = find_aliases(storage);
  const auto optimizer = s.inference ? actors::OptimizerStates{}
                                     : actors::checked(actors::ask<actors::OptimizerStates>(
                                           s.optimizer_shard, s.bound(), "save_checkpoint: the optimizer-shard", actors::states_atom::value));
  std::string entry;
  error.clear();
  try {
    fs::create_directories(partial);
    const auto file = write_rank_file((fs::path(partial) / ("rank" + std::to_string(rank) + ".safetensors")).string(), rank,
                                      storage, layout, aliases);
    entry = json{{"file", json::parse(checkpoint::to_json(file))}, {"aliases", aliases_json(aliases)}}.dump();
    reached(SavePoint::rank_file_written);
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto entries = all_gather_strings(comm, json{{"entry", entry}, {"error", error}}.dump());
  errors.clear();
  for (const auto& e : entries) errors.push_back(json::parse(e)["error"].get<std::string>());
  std::string failure = first_error(errors);

  // 3. Rank 0 writes the manifest and commits.
  if (rank == 0 && failure.empty()) {
    try {
      checkpoint::Manifest m;
      m.tag = tag;
      m.world_size = world;
      m.stage = s.settings.stage;
      m.dtype = affine::dtype_name(affine_dtype(s.spec->dtype));
      auto params = s.module->named_parameters();
      for (const auto& name : s.names) {
        const auto& p = params[name];
        m.parameters.push_back({name, affine_dtype(p.scalar_type()), affine::Dims(p.sizes().vec())});
      }
      for (const auto& map : maps)
        if (std::find(m.kinds.begin(), m.kinds.end(), map.kind) == m.kinds.end()) m.kinds.push_back(map.kind);
      std::map<int, checkpoint::RankAliases> all_aliases;
      for (const auto& e : entries) {
        const auto entry_json = json::parse(json::parse(e)["entry"].get<std::string>());
        m.files.push_back(checkpoint::rank_file_from_json(entry_json["file"].dump(), "a rank's file entry"));
        all_aliases[m.files.back().rank] = aliases_from(entry_json["aliases"]);
      }
      m.maps = layout.saved_maps(maps, all_aliases, m.files);
      m.engine = counters(s, optimizer.updates);
      m.client_state = client.dump();
      m.config = config::to_json(s.config);
      const auto text = checkpoint::to_json(m);
      io::detail::write_file_atomically((fs::path(partial) / checkpoint::kManifestName).string(), {{text.data(), text.size()}});
      reached(SavePoint::manifest_written);
      checkpoint::commit_tag(dir, partial, tag);
      reached(SavePoint::committed);
      if (options.save_latest) checkpoint::write_latest(dir, tag);
      reached(SavePoint::latest_written);
      keep_last(dir, tag, s.config.tessera.checkpoint.keep_last);
    } catch (const std::exception& e) {
      failure = std::string("rank 0: ") + e.what();
    }
  }
  const auto verdicts = all_gather_strings(comm, rank == 0 ? failure : "");
  if (!verdicts[0].empty()) failure = verdicts[0];
  if (!failure.empty()) {
    if (rank == 0) {
      std::error_code ec;
      fs::remove_all(partial, ec);
    }
    throw CheckpointError("save_checkpoint " + (fs::path(dir) / tag).string() + " failed, nothing was committed: " + failure);
  }
  return (fs::path(dir) / tag).string();
}

transport::Communicator* Engine::Impl::control_comm() {
  if (control || spec->world == 1) return control.get();
  if (world) {
    std::vector<int> all(size_t(world->size()));
    for (int r = 0; r < world->size(); ++r) all[size_t(r)] = r;
    control = world->group(all, comm_name + ".ckpt");
  } else {
    transport::CommunicatorOptions options;
    options.timeout = spec->timeout;
    options.name = comm_name + ".ckpt";
    control = transport::Communicator::gloo(actors::job_store(), spec->rank, spec->world, options);
  }
  return control.get();
}

}  // namespace tessera
