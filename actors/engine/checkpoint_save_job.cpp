#include "actors/engine/checkpoint_save_job.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>

#include "actors/engine/checkpoint_support.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/rank_file_writer.h"
#include "core/error.h"
#include "core/io/detail/posix_file.h"
#include "core/log/log.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using nlohmann::json;
using namespace checkpoint_support;

// Writes `tensors` (contiguous, on the CPU) to `path` (rank_file_writer.h); returns the file's entry.
checkpoint::RankFile write_rank_file(const std::string& path, int rank,
                                     const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  std::vector<checkpoint::RankFileBuffer> buffers;
  for (const auto& [key, t] : tensors) {
    if (!t.is_contiguous() || !t.device().is_cpu())
      throw CheckpointError(path + ": tensor '" + key + "' is not a contiguous CPU tensor");
    buffers.push_back({key, affine_dtype(t.scalar_type()), t.data_ptr(), int64_t(t.nbytes())});
  }
  return checkpoint::write_rank_file(path, rank, buffers);
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

std::string run_save_job(const SaveJob& job, transport::Communicator* comm) {
  auto reached = [&](SavePoint point) {
    if (job.at_point_for_testing) job.at_point_for_testing(point);
  };
  // Every rank writes its file.
  std::string entry, error = job.failed_before_writing;
  try {
    if (error.empty()) {
      fs::create_directories(job.partial);
      const auto path = (fs::path(job.partial) / ("rank" + std::to_string(job.rank) + ".safetensors")).string();
      const auto file = write_rank_file(path, job.rank, job.tensors);
      entry = json{{"file", json::parse(checkpoint::to_json(file))}, {"aliases", aliases_json(job.aliases)}}.dump();
      reached(SavePoint::rank_file_written);
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto entries = all_gather_strings(comm, json{{"entry", entry}, {"error", error}}.dump());
  std::vector<std::string> errors;
  for (const auto& e : entries) errors.push_back(json::parse(e)["error"].get<std::string>());
  std::string failure = first_error(errors);

  // Rank 0 writes the manifest and commits.
  if (job.rank == 0 && failure.empty()) {
    try {
      checkpoint::Manifest m = job.manifest;
      std::map<int, checkpoint::RankAliases> all_aliases;
      for (const auto& e : entries) {
        const auto entry_json = json::parse(json::parse(e)["entry"].get<std::string>());
        m.files.push_back(checkpoint::rank_file_from_json(entry_json["file"].dump(), "a rank's file entry"));
        all_aliases[m.files.back().rank] = aliases_from(entry_json["aliases"]);
      }
      m.maps = checkpoint::SaveLayout(job.maps, job.world).saved_maps(job.maps, all_aliases, m.files);
      const auto text = checkpoint::to_json(m);
      io::detail::write_file_atomically((fs::path(job.partial) / checkpoint::kManifestName).string(), {{text.data(), text.size()}});
      reached(SavePoint::manifest_written);
      if (const auto replaced = checkpoint::commit_tag(job.dir, job.partial, job.tag); !replaced.empty()) {
        if (job.removal) job.removal->remove({replaced});
        else fs::remove_all(replaced);
      }
      reached(SavePoint::committed);
      if (job.save_latest) checkpoint::write_latest(job.dir, job.tag);
      reached(SavePoint::latest_written);
      keep_last(job.dir, job.tag, job.keep_last);
    } catch (const std::exception& e) {
      failure = std::string("rank 0: ") + e.what();
    }
  }
  const auto verdicts = all_gather_strings(comm, job.rank == 0 ? failure : "");
  if (!verdicts[0].empty()) failure = verdicts[0];
  if (!failure.empty()) {
    if (job.rank == 0) {
      std::error_code ec;
      fs::remove_all(job.partial, ec);
    }
    throw CheckpointError("save_checkpoint " + (fs::path(job.dir) / job.tag).string() +
                          " failed, nothing was committed: " + failure);
  }
  return (fs::path(job.dir) / job.tag).string();
}

}  // namespace tessera
