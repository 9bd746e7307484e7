#include "core/affine/serialize.h"

#include <cstdio>

#include "core/affine/detail/json_fields.h"

namespace tessera::affine {
namespace {

using detail::as_array;
using detail::as_dims;
using detail::as_int;
using detail::as_rank;
using detail::as_ranks;
using detail::as_string;
using detail::dims_json;
using detail::field;
using detail::Json;
using detail::only_fields;

constexpr int kVersion = 1;

void check_header(const Json& j, const char* format, const std::string& path) {
  const std::string found = as_string(field(j, "format", path), path + ".format");
  if (found != format) throw FormatError(path + ".format is \"" + found + "\", expected \"" + format + "\"");
  const int64_t version = as_int(field(j, "version", path), path + ".version");
  if (version != kVersion) {
    throw FormatError(path + ".version is " + std::to_string(version) + "; this build reads version " +
                      std::to_string(kVersion));
  }
}

Json map_json(const TensorMap& map) {
  Json ranks = Json::array();
  for (const auto& [rank, storage] : map.ranks) {
    Json pieces = Json::array();
    for (const auto& p : storage.pieces) {
      pieces.push_back(Json{{"origin", dims_json(p.box.origin)},
                            {"shape", dims_json(p.box.shape)},
                            {"offset", p.offset},
                            {"strides", dims_json(p.strides)},
                            {"holders", p.holders}});
    }
    Json r{{"rank", rank}, {"buffer_elements", storage.buffer_elements}, {"pieces", pieces}};
    if (!storage.buffer_shape.empty()) r["buffer_shape"] = dims_json(storage.buffer_shape);
    ranks.push_back(r);
  }
  return Json{{"format", "tessera.map"}, {"version", kVersion}, {"name", map.name},
              {"dtype", dtype_name(map.dtype)}, {"shape", dims_json(map.shape)}, {"ranks", ranks}};
}

TensorMap map_of(const Json& j, const std::string& path) {
  check_header(j, "tessera.map", path);
  only_fields(j, {"format", "version", "name", "dtype", "shape", "ranks"}, path);
  TensorMap map;
  map.name = as_string(field(j, "name", path), path + ".name");
  map.dtype = parse_dtype(as_string(field(j, "dtype", path), path + ".dtype"));
  map.shape = as_dims(field(j, "shape", path), path + ".shape");
  const Json& ranks = as_array(field(j, "ranks", path), path + ".ranks");
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string rp = path + ".ranks[" + std::to_string(i) + "]";
    const Json& r = ranks[i];
    only_fields(r, {"rank", "buffer_elements", "buffer_shape", "pieces"}, rp);
    const int rank = as_rank(field(r, "rank", rp), rp + ".rank");
    if (map.ranks.count(rank)) throw FormatError(rp + " repeats rank " + std::to_string(rank));
    RankStorage& storage = map.ranks[rank];
    storage.buffer_elements = as_int(field(r, "buffer_elements", rp), rp + ".buffer_elements");
    if (r.contains("buffer_shape")) storage.buffer_shape = as_dims(r["buffer_shape"], rp + ".buffer_shape");
    const Json& pieces = as_array(field(r, "pieces", rp), rp + ".pieces");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pp = rp + ".pieces[" + std::to_string(k) + "]";
      const Json& pj = pieces[k];
      only_fields(pj, {"origin", "shape", "offset", "strides", "holders"}, pp);
      Piece p;
      const Dims origin = as_dims(field(pj, "origin", pp), pp + ".origin");
      const Dims shape = as_dims(field(pj, "shape", pp), pp + ".shape");
      if (origin.size() != shape.size()) throw FormatError(pp + ": origin and shape have different lengths");
      p.box = Box(origin, shape);
      p.offset = as_int(field(pj, "offset", pp), pp + ".offset");
      p.strides = as_dims(field(pj, "strides", pp), pp + ".strides");
      p.holders = as_ranks(field(pj, "holders", pp), pp + ".holders");
      storage.pieces.push_back(std::move(p));
    }
  }
  return map;
}

Json segment_side(int rank, int64_t offset, const Dims& strides) { return Json::array({rank, offset, dims_json(strides)}); }

void read_side(const Json& v, const std::string& path, int& rank, int64_t& offset, Dims& strides) {
  as_array(v, path);
  if (v.size() != 3) throw FormatError(path + " must be [rank, offset, [strides]]");
  rank = as_rank(v[0], path + "[0]");
  offset = as_int(v[1], path + "[1]");
  strides = as_dims(v[2], path + "[2]");
}

Json plan_json(const Plan& plan) {
  Json segments = Json::array();
  for (const auto& s : plan.segments) {
    segments.push_back(Json{{"source", segment_side(s.source_rank, s.source_offset, s.source_strides)},
                            {"target", segment_side(s.target_rank, s.target_offset, s.target_strides)},
                            {"shape", dims_json(s.shape)}});
  }
  const auto& st = plan.statistics;
  Json per_source = Json::array();
  for (const auto& [rank, bytes] : st.bytes_per_source_rank) per_source.push_back(Json::array({rank, bytes}));
  Json per_pair = Json::array();
  for (const auto& [pair, bytes] : st.bytes_per_pair) per_pair.push_back(Json::array({pair.first, pair.second, bytes}));
  Json stats{{"source_pieces", st.source_pieces},
             {"source_regions", st.source_regions},
             {"target_pieces", st.target_pieces},
             {"candidate_segments", st.candidate_segments},
             {"segments", st.segments},
             {"moved_elements", st.moved_elements},
             {"moved_bytes", st.moved_bytes},
             {"bytes_per_source_rank", per_source},
             {"bytes_per_pair", per_pair}};
  return Json{{"format", "tessera.plan"}, {"version", kVersion},     {"name", plan.name},
              {"dtype", dtype_name(plan.dtype)}, {"shape", dims_json(plan.shape)}, {"policy", plan.policy},
              {"input_digest", hex_digest(plan.input_digest)}, {"digest", hex_digest(plan.digest())},
              {"segments", segments}, {"statistics", stats}};
}

uint64_t parse_hex(const std::string& text, const std::string& path) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos) {
    throw FormatError(path + " must be 16 lower-case hex digits, not \"" + text + "\"");
  }
  return std::stoull(text, nullptr, 16);
}

Plan plan_of(const Json& j, const std::string& path) {
  check_header(j, "tessera.plan", path);
  only_fields(j, {"format", "version", "name", "dtype", "shape", "policy", "input_digest", "digest", "segments",
                  "statistics"},
              path);
  Plan plan;
  plan.name = as_string(field(j, "name", path), path + ".name");
  plan.dtype = parse_dtype(as_string(field(j, "dtype", path), path + ".dtype"));
  plan.shape = as_dims(field(j, "shape", path), path + ".shape");
  plan.policy = as_string(field(j, "policy", path), path + ".policy");
  plan.input_digest = parse_hex(as_string(field(j, "input_digest", path), path + ".input_digest"), path + ".input_digest");
  const Json& segments = as_array(field(j, "segments", path), path + ".segments");
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string sp = path + ".segments[" + std::to_string(i) + "]";
    only_fields(segments[i], {"source", "target", "shape"}, sp);
    Segment s;
    read_side(field(segments[i], "source", sp), sp + ".source", s.source_rank, s.source_offset, s.source_strides);
    read_side(field(segments[i], "target", sp), sp + ".target", s.target_rank, s.target_offset, s.target_strides);
    s.shape = as_dims(field(segments[i], "shape", sp), sp + ".shape");
    if (s.source_strides.size() != s.shape.size() || s.target_strides.size() != s.shape.size()) {
      throw FormatError(sp + ": stride vectors must have one entry per axis of shape");
    }
    plan.segments.push_back(s);
  }
  const uint64_t digest = parse_hex(as_string(field(j, "digest", path), path + ".digest"), path + ".digest");
  if (digest != plan.digest()) {
    throw FormatError(path + ": the plan's digest " + hex_digest(digest) + " does not match its contents (" +
                      hex_digest(plan.digest()) + "); the document was modified or corrupted");
  }
  const Json& st = field(j, "statistics", path);
  const std::string stp = path + ".statistics";
  plan.statistics.source_pieces = as_int(field(st, "source_pieces", stp), stp + ".source_pieces");
  plan.statistics.source_regions = as_int(field(st, "source_regions", stp), stp + ".source_regions");
  plan.statistics.target_pieces = as_int(field(st, "target_pieces", stp), stp + ".target_pieces");
  plan.statistics.candidate_segments = as_int(field(st, "candidate_segments", stp), stp + ".candidate_segments");
  recompute_segment_statistics(plan);
  return plan;
}

}  // namespace

std::string hex_digest(uint64_t digest) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(digest));
  return buf;
}

std::string map_to_json(const TensorMap& map, int indent) { return map_json(map).dump(indent); }

TensorMap map_from_json(const std::string& text) { return map_of(detail::parse_json(text, "the map"), "map"); }

std::string maps_to_json(const std::vector<TensorMap>& maps, int indent) {
  Json list = Json::array();
  for (const auto& m : maps) list.push_back(map_json(m));
  return Json{{"format", "tessera.map_set"}, {"version", kVersion}, {"maps", list}}.dump(indent);
}

std::vector<TensorMap> maps_from_json(const std::string& text) {
  const Json j = detail::parse_json(text, "the map set");
  if (j.is_object() && j.contains("format") && j["format"] == "tessera.map") return {map_of(j, "map")};
  check_header(j, "tessera.map_set", "map_set");
  only_fields(j, {"format", "version", "maps"}, "map_set");
  const Json& list = as_array(field(j, "maps", "map_set"), "map_set.maps");
  std::vector<TensorMap> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back(map_of(list[i], "map_set.maps[" + std::to_string(i) + "]"));
  return out;
}

std::string plan_to_json(const Plan& plan, int indent) { return plan_json(plan).dump(indent); }

Plan plan_from_json(const std::string& text) { return plan_of(detail::parse_json(text, "the plan"), "plan"); }

std::string plans_to_json(const std::vector<Plan>& plans, int indent) {
  Json list = Json::array();
  for (const auto& p : plans) list.push_back(plan_json(p));
  return Json{{"format", "tessera.plan_set"}, {"version", kVersion}, {"plans", list}}.dump(indent);
}

std::vector<Plan> plans_from_json(const std::string& text) {
  const Json j = detail::parse_json(text, "the plan set");
  if (j.is_object() && j.contains("format") && j["format"] == "tessera.plan") return {plan_of(j, "plan")};
  check_header(j, "tessera.plan_set", "plan_set");
  only_fields(j, {"format", "version", "plans"}, "plan_set");
  const Json& list = as_array(field(j, "plans", "plan_set"), "plan_set.plans");
  std::vector<Plan> out;
  for (size_t i = 0; i < list.size(); ++i) out.push_back(plan_of(list[i], "plan_set.plans[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace tessera::affine
