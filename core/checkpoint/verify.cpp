#include "core/checkpoint/verify.h"

#include <filesystem>
#include <map>
#include <sstream>

#include "core/affine/validate.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/io/detail/posix_file.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {

std::string tag_directory(const std::string& dir) {
  if (fs::is_regular_file(fs::path(dir) / kManifestName)) return dir;
  return (fs::path(dir) / read_latest(dir)).string();
}

Manifest read_manifest(const std::string& tag_dir) {
  const auto path = (fs::path(tag_dir) / kManifestName).string();
  if (!fs::is_regular_file(path)) throw CheckpointError(tag_dir + ": no " + std::string(kManifestName) + ": not a committed checkpoint");
  return manifest_from_json(read_text(path), path);
}

namespace {

void check_file(const std::string& tag_dir, const RankFile& f, VerifyReport& report) {
  const auto path = (fs::path(tag_dir) / f.file).string();
  if (!fs::is_regular_file(path)) {
    report.problems.push_back(path + ": missing (or not a regular file)");
    return;
  }
  io::detail::ReadOnlyFile file(path);
  if (int64_t(file.size_bytes()) != f.bytes) {
    report.problems.push_back(path + ": " + std::to_string(file.size_bytes()) + " bytes, the manifest says " +
                              std::to_string(f.bytes));
    return;
  }
  if (hash_file(path) != f.hash) report.problems.push_back(path + ": the file's XXH3 does not match the manifest's");
  std::vector<char> chunk;
  for (const auto& b : f.buffers) {
    const int64_t bytes = b.elements * affine::element_size(b.dtype);
    for (size_t c = 0; c < b.chunk_hashes.size(); ++c) {
      const int64_t begin = int64_t(c) * b.chunk_bytes, n = std::min(b.chunk_bytes, bytes - begin);
      chunk.resize(size_t(n));
      file.pread_exact(chunk.data(), uint64_t(n), uint64_t(b.data_offset + begin), "buffer '" + b.key + "'");
      if (xxh3(chunk.data(), size_t(n)) != b.chunk_hashes[c]) {
        report.problems.push_back(path + ": buffer '" + b.key + "' bytes [" + std::to_string(begin) + ", " +
                                  std::to_string(begin + n) + ") do not match their hash");
        break;
      }
      report.bytes_checked += n;
    }
  }
}

void check_map(const Manifest& m, const SavedMap& s, const std::map<std::string, const ParameterInfo*>& params,
               VerifyReport& report) {
  const std::string what = "tensor '" + s.map.name + "' (" + s.kind + ")";
  const auto p = params.find(s.map.name);
  if (p == params.end()) {
    report.problems.push_back(what + ": not a parameter of the manifest");
    return;
  }
  if (!(p->second->shape == s.map.shape)) {
    report.problems.push_back(what + ": mapped as " + affine::to_string(s.map.shape) + ", the parameter is " +
                              affine::to_string(p->second->shape));
    return;
  }
  try {
    affine::validate_map(s.map);
  } catch (const std::exception& e) {
    report.problems.push_back(what + ": " + e.what());
    return;
  }
  for (const auto& [rank, storage] : s.map.ranks) {
    if (storage.pieces.empty()) continue;
    const auto key = s.buffers.find(rank);
    const RankFile* file = nullptr;
    for (const auto& f : m.files)
      if (f.rank == rank) file = &f;
    const SavedBuffer* buffer = key == s.buffers.end() || !file ? nullptr : file->find(key->second);
    if (!buffer) {
      report.problems.push_back(what + ": its pieces on file rank " + std::to_string(rank) + " name no saved buffer");
      continue;
    }
    if (buffer->dtype != s.map.dtype || storage.buffer_elements != buffer->elements)
      report.problems.push_back(what + ": buffer '" + buffer->key + "' of " + file->file + " is " +
                                affine::dtype_name(buffer->dtype) + " x " + std::to_string(buffer->elements) +
                                ", the map says " + affine::dtype_name(s.map.dtype) + " x " +
                                std::to_string(storage.buffer_elements));
  }
  ++report.maps_checked;
}

}  // namespace

VerifyReport verify_tag(const std::string& tag_dir) {
  VerifyReport report;
  report.tag_dir = tag_dir;
  const auto m = read_manifest(tag_dir);
  for (const auto& f : m.files) {
    try {
      check_file(tag_dir, f, report);
    } catch (const std::exception& e) {
      report.problems.push_back(e.what());
    }
  }
  std::map<std::string, const ParameterInfo*> params;
  for (const auto& p : m.parameters) params[p.name] = &p;
  for (const auto& s : m.maps) check_map(m, s, params, report);
  return report;
}

std::string describe(const Manifest& m) {
  std::ostringstream out;
  out << "checkpoint '" << m.tag << "': data-parallel " << m.world_size << ", stage " << m.stage << ", tensor-parallel "
      << m.tp_size << ", " << m.dtype << "\n";
  out << "steps: global " << m.engine.global_steps << ", micro " << m.engine.micro_steps << ", skipped "
      << m.engine.skipped_steps << ", optimizer updates " << m.engine.optimizer_updates;
  if (m.engine.has_loss_scaler) out << ", loss scale " << m.engine.loss_scaler.scale;
  out << "\n";
  int64_t elements = 0;
  for (const auto& p : m.parameters) elements += p.shape.product();
  out << m.parameters.size() << " parameters, " << elements << " elements; kinds:";
  for (const auto& k : m.kinds) out << " " << k;
  out << "\n";
  int64_t total = 0;
  for (const auto& f : m.files) {
    out << f.file << " (rank " << f.rank << ", " << f.bytes << " bytes):";
    for (const auto& b : f.buffers) out << " " << b.key << " " << affine::dtype_name(b.dtype) << " x " << b.elements << ";";
    out << "\n";
    total += f.bytes;
  }
  out << "total " << total << " bytes in " << m.files.size() << " files; client_state " << m.client_state << "\n";
  return out.str();
}

}  // namespace tessera::checkpoint
