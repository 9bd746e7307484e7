// tessera's JSON form of maps and plans: exact round trips (load(save(x)) == x), strict loading
// (unknown keys, missing keys, wrong types and a plan whose digest does not match its segments are
// refused with a FormatError naming the JSON path), integers as JSON integers (int64).
//
// Map:  {"format": "tessera.map", "version": 1, "name": "w", "dtype": "f32", "shape": [8, 8],
//        "ranks": [{"rank": 0, "buffer_elements": 32, "buffer_shape": [4, 8],
//                   "pieces": [{"origin": [0, 0], "shape": [4, 8], "offset": 0, "strides": [8, 1],
//                               "holders": [0]}]}, ...]}
// Plan: {"format": "tessera.plan", "version": 1, "name": "w", "dtype": "f32", "shape": [8, 8],
//        "policy": "lowest", "input_digest": "9f0c...", "digest": "41aa...",
//        "segments": [{"source": [0, 2, [8, 1]], "target": [1, 0, [2, 1]], "shape": [4, 2]}, ...],
//        "statistics": {...}}
// Sets: {"format": "tessera.map_set", "version": 1, "maps": [...]}, likewise "tessera.plan_set" / "plans".
// Loading a map does not validate it (so `tessera affine check` can diagnose it): call validate_map().
#pragma once

#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/plan.h"

namespace tessera::affine {

std::string map_to_json(const TensorMap& map, int indent = -1);
TensorMap map_from_json(const std::string& text);
std::string maps_to_json(const std::vector<TensorMap>& maps, int indent = -1);
std::vector<TensorMap> maps_from_json(const std::string& text);  // a map set or a single map

std::string plan_to_json(const Plan& plan, int indent = -1);
Plan plan_from_json(const std::string& text);
std::string plans_to_json(const std::vector<Plan>& plans, int indent = -1);
std::vector<Plan> plans_from_json(const std::string& text);  // a plan set or a single plan

std::string hex_digest(uint64_t digest);  // 16 lower-case hex digits

}  // namespace tessera::affine
