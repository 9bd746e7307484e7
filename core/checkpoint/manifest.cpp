#include "core/checkpoint/manifest.h"

#include <nlohmann/json.hpp>

#include <cstdio>

#include "core/affine/dtype.h"
#include "core/affine/serialize.h"
#include "core/error.h"

namespace tessera::checkpoint {
namespace {

using nlohmann::json;

std::string hex(uint64_t h) { return affine::hex_digest(h); }

uint64_t from_hex(const std::string& text) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw std::invalid_argument("expected 16 lower-case hex digits, got '" + text + "'");
  return std::stoull(text, nullptr, 16);
}

json dims(const affine::Dims& d) {
  json out = json::array();
  for (int k = 0; k < d.size(); ++k) out.push_back(d[k]);
  return out;
}

affine::Dims dims_from(const json& j) {
  std::vector<int64_t> v = j.get<std::vector<int64_t>>();
  return affine::Dims(v);
}

json counters_json(const EngineCounters& c) {
  json j{{"global_steps", c.global_steps},
         {"micro_steps", c.micro_steps},
         {"skipped_steps", c.skipped_steps},
         {"optimizer_updates", c.optimizer_updates},
         {"group_lrs", c.group_lrs},
         {"last_lrs", c.last_lrs}};
  if (c.has_loss_scaler) {
    const auto& s = c.loss_scaler;
    j["loss_scaler"] = {{"scale", s.scale},
                        {"iteration", s.iteration},
                        {"last_overflow_iteration", s.last_overflow_iteration},
                        {"hysteresis_left", s.hysteresis_left},
                        {"skipped_steps", s.skipped_steps}};
  }
  return j;
}

EngineCounters counters_from(const json& j) {
  EngineCounters c;
  c.global_steps = j.at("global_steps").get<int64_t>();
  c.micro_steps = j.at("micro_steps").get<int64_t>();
  c.skipped_steps = j.at("skipped_steps").get<int64_t>();
  c.optimizer_updates = j.at("optimizer_updates").get<int64_t>();
  c.group_lrs = j.at("group_lrs").get<std::vector<double>>();
  c.last_lrs = j.at("last_lrs").get<std::vector<double>>();
  if (j.contains("loss_scaler")) {
    const auto& s = j.at("loss_scaler");
    c.has_loss_scaler = true;
    c.loss_scaler.scale = s.at("scale").get<double>();
    c.loss_scaler.iteration = s.at("iteration").get<int64_t>();
    c.loss_scaler.last_overflow_iteration = s.at("last_overflow_iteration").get<int64_t>();
    c.loss_scaler.hysteresis_left = s.at("hysteresis_left").get<int64_t>();
    c.loss_scaler.skipped_steps = s.at("skipped_steps").get<int64_t>();
  }
  return c;
}

json file_json(const RankFile& f) {
  json buffers = json::array();
  for (const auto& b : f.buffers) {
    json hashes = json::array();
    for (auto h : b.chunk_hashes) hashes.push_back(hex(h));
    buffers.push_back({{"key", b.key},
                       {"dtype", affine::dtype_name(b.dtype)},
                       {"elements", b.elements},
                       {"data_offset", b.data_offset},
                       {"chunk_bytes", b.chunk_bytes},
                       {"chunk_xxh3", hashes}});
  }
  return {{"rank", f.rank}, {"file", f.file}, {"bytes", f.bytes}, {"xxh3", hex(f.hash)}, {"buffers", buffers}};
}

RankFile file_from(const json& f) {
  RankFile file;
  file.rank = f.at("rank").get<int>();
  file.file = f.at("file").get<std::string>();
  if (file.file.empty() || file.file.find('/') != std::string::npos || file.file[0] == '.')
    throw std::invalid_argument("file name '" + file.file + "' is not a plain name inside the tag directory");
  file.bytes = f.at("bytes").get<int64_t>();
  file.hash = from_hex(f.at("xxh3").get<std::string>());
  for (const auto& b : f.at("buffers")) {
    SavedBuffer buffer;
    buffer.key = b.at("key").get<std::string>();
    buffer.dtype = affine::parse_dtype(b.at("dtype").get<std::string>());
    buffer.elements = b.at("elements").get<int64_t>();
    buffer.data_offset = b.at("data_offset").get<int64_t>();
    buffer.chunk_bytes = b.at("chunk_bytes").get<int64_t>();
    for (const auto& h : b.at("chunk_xxh3")) buffer.chunk_hashes.push_back(from_hex(h.get<std::string>()));
    const int64_t bytes = buffer.elements * affine::element_size(buffer.dtype);
    if (buffer.chunk_bytes <= 0 || buffer.elements < 0 ||
        int64_t(buffer.chunk_hashes.size()) != (bytes + buffer.chunk_bytes - 1) / buffer.chunk_bytes ||
        buffer.data_offset < 0 || buffer.data_offset + bytes > file.bytes)
      throw std::invalid_argument("buffer '" + buffer.key + "': its size, chunks and offset do not fit the file");
    file.buffers.push_back(std::move(buffer));
  }
  return file;
}

}  // namespace

const SavedBuffer* RankFile::find(const std::string& key) const {
  for (const auto& b : buffers)
    if (b.key == key) return &b;
  return nullptr;
}

const RankFile& Manifest::file_of_rank(int rank) const {
  for (const auto& f : files)
    if (f.rank == rank) return f;
  throw CheckpointError("checkpoint '" + tag + "': the manifest lists no file of rank " + std::to_string(rank));
}

std::string to_json(const RankFile& file) { return file_json(file).dump(); }

RankFile rank_file_from_json(const std::string& text, const std::string& where) {
  try {
    return file_from(json::parse(text));
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": not a valid rank file entry: " + e.what());
  }
}

std::string to_json(const Manifest& m) {
  json j;
  j["format"] = kFormat;
  j["version"] = kFormatVersion;
  j["tag"] = m.tag;
  j["layout"] = {{"data_parallel", m.world_size}, {"stage", m.stage}, {"tensor_parallel", m.tp_size}};
  j["dtype"] = m.dtype;
  json params = json::array();
  for (const auto& p : m.parameters)
    params.push_back({{"name", p.name}, {"dtype", affine::dtype_name(p.dtype)}, {"shape", dims(p.shape)}});
  j["parameters"] = params;
  json frozen = json::array();
  for (const auto& f : m.frozen)
    frozen.push_back({{"name", f.name}, {"dtype", affine::dtype_name(f.dtype)}, {"shape", dims(f.shape)},
                      {"file", f.file}, {"buffer", f.buffer}});
  j["frozen"] = frozen;
  j["kinds"] = m.kinds;
  json files = json::array();
  for (const auto& f : m.files) files.push_back(file_json(f));
  j["files"] = files;
  json maps = json::array();
  for (const auto& s : m.maps) {
    json buffers = json::object();
    for (const auto& [rank, key] : s.buffers) buffers[std::to_string(rank)] = key;
    maps.push_back({{"kind", s.kind}, {"buffers", buffers}, {"map", json::parse(affine::map_to_json(s.map))}});
  }
  j["maps"] = maps;
  j["engine"] = counters_json(m.engine);
  j["client_state"] = json::parse(m.client_state);
  j["config"] = m.config.empty() ? json::object() : json::parse(m.config);
  return j.dump(1);
}

Manifest manifest_from_json(const std::string& text, const std::string& where) {
  std::string at = "";  // the JSON path being read, for the error
  try {
    const json j = json::parse(text);
    at = "format";
    if (j.at("format").get<std::string>() != kFormat) throw std::invalid_argument("not a tessera checkpoint manifest");
    at = "version";
    if (j.at("version").get<int>() != kFormatVersion)
      throw std::invalid_argument("version " + std::to_string(j.at("version").get<int>()) + " (this build reads " +
                                  std::to_string(kFormatVersion) + ")");
    Manifest m;
    at = "tag";
    m.tag = j.at("tag").get<std::string>();
    at = "layout";
    m.world_size = j.at("layout").at("data_parallel").get<int>();
    m.stage = j.at("layout").at("stage").get<int>();
    m.tp_size = j.at("layout").at("tensor_parallel").get<int>();
    at = "dtype";
    m.dtype = j.at("dtype").get<std::string>();
    for (size_t i = 0; i < j.at("parameters").size(); ++i) {
      at = "parameters[" + std::to_string(i) + "]";
      const auto& p = j.at("parameters")[i];
      m.parameters.push_back({p.at("name").get<std::string>(), affine::parse_dtype(p.at("dtype").get<std::string>()),
                              dims_from(p.at("shape"))});
    }
    at = "kinds";
    m.kinds = j.at("kinds").get<std::vector<std::string>>();
    for (size_t i = 0; i < j.at("files").size(); ++i) {
      at = "files[" + std::to_string(i) + "]";
      m.files.push_back(file_from(j.at("files")[i]));
    }
    for (size_t i = 0; i < j.at("maps").size(); ++i) {
      at = "maps[" + std::to_string(i) + "]";
      const auto& s = j.at("maps")[i];
      SavedMap map;
      map.kind = s.at("kind").get<std::string>();
      for (const auto& [rank, key] : s.at("buffers").items()) map.buffers[std::stoi(rank)] = key.get<std::string>();
      map.map = affine::map_from_json(s.at("map").dump());
      m.maps.push_back(std::move(map));
    }
    m.frozen_recorded = j.contains("frozen");
    for (size_t i = 0; m.frozen_recorded && i < j.at("frozen").size(); ++i) {
      at = "frozen[" + std::to_string(i) + "]";
      const auto& f = j.at("frozen")[i];
      FrozenTensor t{f.at("name").get<std::string>(), affine::parse_dtype(f.at("dtype").get<std::string>()),
                     dims_from(f.at("shape")), f.at("file").get<int>(), f.at("buffer").get<std::string>()};
      const RankFile* file = nullptr;
      for (const auto& candidate : m.files)
        if (candidate.rank == t.file) file = &candidate;
      const SavedBuffer* b = file ? file->find(t.buffer) : nullptr;
      if (!b || b->dtype != t.dtype || b->elements != t.shape.product())
        throw std::invalid_argument("'" + t.name + "': no " + affine::dtype_name(t.dtype) + " buffer '" + t.buffer + "' of " +
                                    std::to_string(t.shape.product()) + " elements in the file of rank " + std::to_string(t.file));
      m.frozen.push_back(std::move(t));
    }
    at = "engine";
    m.engine = counters_from(j.at("engine"));
    at = "client_state";
    if (!j.at("client_state").is_object()) throw std::invalid_argument("not a JSON object");
    m.client_state = j.at("client_state").dump();
    at = "config";
    m.config = j.at("config").dump();
    return m;
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(where + ": not a valid checkpoint manifest" + (at.empty() ? "" : " at '" + at + "'") + ": " +
                          e.what());
  }
}

}  // namespace tessera::checkpoint
