// Strict readers of nlohmann::json fields for the affine formats: each names the JSON path of a
// missing or mistyped field in its FormatError. Internal to core/affine (.cpp files only).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/affine/box.h"
#include "core/affine/errors.h"

namespace tessera::affine::detail {

using Json = nlohmann::json;

inline Json parse_json(const std::string& text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw FormatError(what + " is not valid JSON: " + e.what());
  }
}

inline const Json& field(const Json& obj, const char* key, const std::string& path) {
  if (!obj.is_object()) throw FormatError(path + " must be a JSON object");
  auto it = obj.find(key);
  if (it == obj.end()) throw FormatError(path + " has no field \"" + key + "\"");
  return *it;
}

inline void only_fields(const Json& obj, std::initializer_list<const char*> allowed, const std::string& path) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* key : allowed) known = known || it.key() == key;
    if (!known) throw FormatError(path + " has an unknown field \"" + it.key() + "\"");
  }
}

inline int64_t as_int(const Json& v, const std::string& path) {
  if (!v.is_number_integer()) throw FormatError(path + " must be an integer, not " + v.dump());
  return v.get<int64_t>();
}

inline int as_rank(const Json& v, const std::string& path) {
  const int64_t r = as_int(v, path);
  if (r < INT32_MIN || r > INT32_MAX) throw FormatError(path + " = " + std::to_string(r) + " is not a rank");
  return static_cast<int>(r);
}

inline std::string as_string(const Json& v, const std::string& path) {
  if (!v.is_string()) throw FormatError(path + " must be a string, not " + v.dump());
  return v.get<std::string>();
}

inline const Json& as_array(const Json& v, const std::string& path) {
  if (!v.is_array()) throw FormatError(path + " must be an array, not " + v.dump());
  return v;
}

inline Dims as_dims(const Json& v, const std::string& path) {
  as_array(v, path);
  if (v.size() > static_cast<size_t>(kMaxDims)) throw FormatError(path + " has more than 8 entries");
  Dims d;
  for (size_t i = 0; i < v.size(); ++i) d.push_back(as_int(v[i], path + "[" + std::to_string(i) + "]"));
  return d;
}

inline Json dims_json(const Dims& d) {
  Json out = Json::array();
  for (int64_t v : d) out.push_back(v);
  return out;
}

inline std::vector<int> as_ranks(const Json& v, const std::string& path) {
  as_array(v, path);
  std::vector<int> out;
  for (size_t i = 0; i < v.size(); ++i) out.push_back(as_rank(v[i], path + "[" + std::to_string(i) + "]"));
  return out;
}

}  // namespace tessera::affine::detail
