#include "core/affine/deepspeed_format.h"

#include "core/affine/detail/json_fields.h"
#include "core/affine/run_boxes.h"
#include "core/affine/serialize.h"

namespace tessera::affine {
namespace {

using detail::as_array;
using detail::as_dims;
using detail::as_int;
using detail::as_ranks;
using detail::dims_json;
using detail::field;
using detail::Json;
using detail::only_fields;

Json ds_map(const TensorMap& map) {
  const Dims logical_strides = row_major_strides(map.shape);
  Json ranks = Json::object();
  for (const auto& [rank, storage] : map.ranks) {
    Json pieces = Json::array();
    for (const auto& p : storage.pieces) {
      int64_t source_offset = 0;
      for (int k = 0; k < p.box.ndim(); ++k) source_offset += p.box.origin[k] * logical_strides[k];
      pieces.push_back(Json{{"shape", dims_json(p.box.shape)},
                            {"source", Json::array({source_offset, dims_json(logical_strides)})},
                            {"dest", Json::array({p.offset, dims_json(p.strides)})},
                            {"locations", p.holders}});
    }
    const Dims shard = storage.buffer_shape.empty() ? Dims{storage.buffer_elements} : storage.buffer_shape;
    ranks[std::to_string(rank)] = Json{{"shard_shape", dims_json(shard)}, {"pieces", pieces}};
  }
  return Json{{"logical_shape", dims_json(map.shape)}, {"ranks", ranks}};
}

int rank_key(const std::string& key, const std::string& path) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(key, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != key.size() || key.empty() || value < INT32_MIN || value > INT32_MAX) {
    throw FormatError(path + " has rank key \"" + key + "\", which is not an integer");
  }
  return static_cast<int>(value);
}

TensorMap ds_map_of(const Json& j, const std::string& name, DType dtype, const std::string& path) {
  only_fields(j, {"logical_shape", "ranks"}, path);
  TensorMap map;
  map.name = name;
  map.dtype = dtype;
  map.shape = as_dims(field(j, "logical_shape", path), path + ".logical_shape");
  const Dims logical_strides = row_major_strides(map.shape);
  const Json& ranks = field(j, "ranks", path);
  if (!ranks.is_object()) throw FormatError(path + ".ranks must be an object keyed by rank");
  for (auto it = ranks.begin(); it != ranks.end(); ++it) {
    const std::string rp = path + ".ranks[\"" + it.key() + "\"]";
    const int rank = rank_key(it.key(), path + ".ranks");
    only_fields(*it, {"shard_shape", "pieces"}, rp);
    RankStorage& storage = map.ranks[rank];
    storage.buffer_shape = as_dims(field(*it, "shard_shape", rp), rp + ".shard_shape");
    storage.buffer_elements = storage.buffer_shape.product();
    const Json& pieces = as_array(field(*it, "pieces", rp), rp + ".pieces");
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string pp = rp + ".pieces[" + std::to_string(k) + "]";
      const Json& pj = pieces[k];
      only_fields(pj, {"shape", "source", "dest", "locations", "scale"}, pp);
      if (pj.contains("scale")) {
        if (!pj["scale"].is_number()) throw FormatError(pp + ".scale must be a number");
        if (pj["scale"].get<double>() != 1.0) {
          throw UnsupportedLayoutError("tensor '" + name + "': " + pp + " has scale " + pj["scale"].dump() +
                                       "; tessera moves bits exactly and supports only scale 1");
        }
      }
      const Dims shape = as_dims(field(pj, "shape", pp), pp + ".shape");
      const Json& source = as_array(field(pj, "source", pp), pp + ".source");
      const Json& dest = as_array(field(pj, "dest", pp), pp + ".dest");
      if (source.size() != 2 || dest.size() != 2) throw FormatError(pp + ": source and dest must be [offset, [strides]]");
      const int64_t source_offset = as_int(source[0], pp + ".source[0]");
      const Dims source_strides = as_dims(source[1], pp + ".source[1]");
      Piece p;
      p.offset = as_int(dest[0], pp + ".dest[0]");
      p.strides = as_dims(dest[1], pp + ".dest[1]");
      p.holders = as_ranks(field(pj, "locations", pp), pp + ".locations");
      if (shape.size() != map.shape.size()) {
        throw InvalidMapError("tensor '" + name + "': " + pp + " spans " + std::to_string(shape.size()) + " axes of a " +
                              std::to_string(map.shape.size()) + "-axis tensor");
      }
      if (source_strides.size() != shape.size() || p.strides.size() != shape.size()) {
        throw InvalidMapError("tensor '" + name + "': " + pp + ": stride vector length must match the piece rank");
      }
      Dims origin(shape.size());
      int64_t rest = source_offset;
      const bool empty = shape.product() == 0;
      for (int a = 0; a < shape.size(); ++a) {
        if (shape[a] > 1 && source_strides[a] != logical_strides[a]) {
          throw UnsupportedLayoutError("tensor '" + name + "': " + pp + ": source axis " + std::to_string(a) +
                                       " strides " + std::to_string(source_strides[a]) + ", expected " +
                                       std::to_string(logical_strides[a]));
        }
        origin[a] = rest / logical_strides[a];
        rest %= logical_strides[a];
      }
      if (!empty && (rest != 0 || source_offset < 0 || !Box::whole(map.shape).contains(Box(origin, shape)))) {
        throw InvalidMapError("tensor '" + name + "': " + pp + ": source offset " + std::to_string(source_offset) +
                              " is not a coordinate of a " + to_string(map.shape) + " tensor from which shape " +
                              to_string(shape) + " fits");
      }
      p.box = Box(origin, shape);
      storage.pieces.push_back(std::move(p));
    }
  }
  return map;
}

Json ds_plan(const Plan& plan) {
  Json segments = Json::array();
  for (const auto& s : plan.segments) {
    segments.push_back(Json{{"shape", dims_json(s.shape)},
                            {"source", Json::array({s.source_rank, s.source_offset, dims_json(s.source_strides)})},
                            {"target", Json::array({s.target_rank, s.target_offset, dims_json(s.target_strides)})}});
  }
  return Json{{"logical_shape", dims_json(plan.shape)}, {"segments", segments}};
}

std::string escape_regex(const std::string& name) {
  std::string out;
  for (char c : name) {
    if (std::string("\\^$.|?*+()[]{}-").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

std::string unescape_regex(const std::string& key) {
  std::string body = key;
  if (!body.empty() && body.front() == '^') body.erase(0, 1);
  if (!body.empty() && body.back() == '$') body.pop_back();
  std::string out;
  for (size_t i = 0; i < body.size(); ++i) {
    if (body[i] == '\\' && i + 1 < body.size()) ++i;
    out += body[i];
  }
  return out;
}

std::vector<TensorMap> ds_params(const Json& j, DType dtype) {
  const Json& params = field(j, "params", "affine_map");
  if (!params.is_object()) throw FormatError("affine_map.params must be an object keyed by parameter pattern");
  std::vector<TensorMap> out;
  for (auto it = params.begin(); it != params.end(); ++it) {
    out.push_back(ds_map_of(*it, unescape_regex(it.key()), dtype, "affine_map.params[\"" + it.key() + "\"]"));
  }
  return out;
}

}  // namespace

std::string map_to_deepspeed_json(const TensorMap& map, int indent) { return ds_map(map).dump(indent); }

TensorMap map_from_deepspeed_json(const std::string& text, const std::string& name, DType dtype) {
  return ds_map_of(detail::parse_json(text, "the DeepSpeed map"), name, dtype, "map");
}

std::string plan_to_deepspeed_json(const Plan& plan, int indent) { return ds_plan(plan).dump(indent); }

Plan plan_from_deepspeed_json(const std::string& text, const std::string& name, DType dtype) {
  const Json j = detail::parse_json(text, "the DeepSpeed plan");
  only_fields(j, {"logical_shape", "segments", "logical_origin"}, "plan");
  Plan plan;
  plan.name = name;
  plan.dtype = dtype;
  plan.policy = "imported";
  plan.shape = as_dims(field(j, "logical_shape", "plan"), "plan.logical_shape");
  const Json& segments = as_array(field(j, "segments", "plan"), "plan.segments");
  for (size_t i = 0; i < segments.size(); ++i) {
    const std::string sp = "plan.segments[" + std::to_string(i) + "]";
    only_fields(segments[i], {"shape", "source", "target", "logical_origin"}, sp);
    Segment s;
    s.shape = as_dims(field(segments[i], "shape", sp), sp + ".shape");
    for (const char* side : {"source", "target"}) {
      const Json& v = as_array(field(segments[i], side, sp), sp + "." + side);
      if (v.size() != 3) throw FormatError(sp + "." + side + " must be [rank, offset, [strides]]");
      const int rank = detail::as_rank(v[0], sp + "." + side + "[0]");
      const int64_t offset = as_int(v[1], sp + "." + side + "[1]");
      const Dims strides = as_dims(v[2], sp + "." + side + "[2]");
      if (strides.size() != s.shape.size()) throw FormatError(sp + "." + side + ": stride vector length must match shape");
      if (side[0] == 's') {
        s.source_rank = rank, s.source_offset = offset, s.source_strides = strides;
      } else {
        s.target_rank = rank, s.target_offset = offset, s.target_strides = strides;
      }
    }
    plan.segments.push_back(s);
  }
  recompute_segment_statistics(plan);
  return plan;
}

std::string maps_to_deepspeed_json(const std::vector<TensorMap>& maps, int indent) {
  Json params = Json::object();
  for (const auto& m : maps) params["^" + escape_regex(m.name) + "$"] = ds_map(m);
  return Json{{"version", 1}, {"params", params}}.dump(indent);
}

std::vector<TensorMap> maps_from_deepspeed_json(const std::string& text, DType dtype) {
  return ds_params(detail::parse_json(text, "the DeepSpeed affine_map"), dtype);
}

std::vector<TensorMap> read_maps_any_format(const std::string& text) {
  const Json j = detail::parse_json(text, "the map document");
  if (j.is_object() && j.contains("format")) return maps_from_json(text);
  if (j.is_object() && j.contains("logical_shape")) return {ds_map_of(j, "tensor", DType::f32, "map")};
  if (j.is_object() && j.contains("affine_map")) return ds_params(j["affine_map"], DType::f32);
  if (j.is_object() && j.contains("params")) return ds_params(j, DType::f32);
  throw FormatError("the map document is neither a tessera map (\"format\") nor a DeepSpeed map (\"logical_shape\") "
                    "nor a DeepSpeed affine_map document (\"params\")");
}

}  // namespace tessera::affine
