#include "core/zero/unit_layout.h"

#include <map>

#include "core/error.h"

namespace tessera::zero {

Stage3Layout make_stage3_layout(const std::vector<Stage3Parameter>& parameters, int64_t groups, int world,
                                int64_t alignment) {
  auto fail = [](const std::string& what) { throw Error("ZeRO-3 layout: " + what); };
  if (world < 1) fail("data-parallel size " + std::to_string(world) + " < 1");
  if (alignment < 1) fail("alignment " + std::to_string(alignment) + " < 1");
  Stage3Layout out;
  out.world = world;
  const size_t n = parameters.size();
  out.places.assign(n, {-1, -1});
  out.index_in_group.assign(n, -1);
  // Units in first-appearance order; per unit and group, its parameters (ascending); per group, the
  // persistent ones.
  std::map<std::string, int64_t> unit_of;
  std::vector<std::map<int64_t, std::vector<int64_t>>> unit_group_params;
  std::vector<std::vector<int64_t>> persistent(static_cast<size_t>(groups));
  std::vector<int64_t> group_count(static_cast<size_t>(groups), 0);
  for (size_t i = 0; i < n; ++i) {
    const auto& p = parameters[i];
    if (p.group < 0 || p.group >= groups)
      fail("parameter '" + p.name + "' is in flat group " + std::to_string(p.group) + " of " + std::to_string(groups));
    if (p.numel < 0) fail("parameter '" + p.name + "' has negative size " + std::to_string(p.numel));
    out.index_in_group[i] = group_count[size_t(p.group)]++;
    if (p.persistent) {
      persistent[size_t(p.group)].push_back(int64_t(i));
      continue;
    }
    auto [it, fresh] = unit_of.emplace(p.module, int64_t(out.units.size()));
    if (fresh) {
      out.units.push_back({p.module, {}, {}, 0});
      unit_group_params.emplace_back();
    }
    out.units[size_t(it->second)].params.push_back(int64_t(i));
    unit_group_params[size_t(it->second)][p.group].push_back(int64_t(i));
  }
  auto add_segment = [&](int64_t unit, int64_t group, const std::vector<int64_t>& params, int64_t& offset) {
    Stage3Segment s;
    s.unit = unit, s.group = group, s.params = params, s.partition_offset = offset;
    std::vector<std::string> names;
    std::vector<int64_t> numels;
    for (int64_t i : params) {
      names.push_back(parameters[size_t(i)].name);
      numels.push_back(parameters[size_t(i)].numel);
    }
    s.layout = make_flat_group_layout(names, numels, world, alignment);
    offset += s.layout.partition_numel;
    const int64_t index = int64_t(out.segments.size());
    for (size_t k = 0; k < params.size(); ++k) out.places[size_t(params[k])] = {index, int64_t(k)};
    out.group_segments[size_t(group)].push_back(index);
    if (unit >= 0) out.units[size_t(unit)].segments.push_back(index);
    out.segments.push_back(std::move(s));
  };
  out.group_segments.resize(size_t(groups));
  out.persistent_segment.assign(size_t(groups), -1);
  for (int64_t g = 0; g < groups; ++g) {
    int64_t offset = 0;
    if (!persistent[size_t(g)].empty()) {
      out.persistent_segment[size_t(g)] = int64_t(out.segments.size());
      add_segment(-1, g, persistent[size_t(g)], offset);
    }
    for (size_t u = 0; u < out.units.size(); ++u) {
      auto it = unit_group_params[u].find(g);
      if (it != unit_group_params[u].end()) add_segment(int64_t(u), g, it->second, offset);
    }
    out.partition_numel.push_back(offset);
    if (out.persistent_segment[size_t(g)] >= 0) out.segments[size_t(out.persistent_segment[size_t(g)])].gathered_offset = offset;
  }
  // Each unit's gathered buffer: its segments one after the other.
  for (auto& unit : out.units) {
    for (int64_t s : unit.segments) {
      out.segments[size_t(s)].gathered_offset = unit.gathered_numel;
      unit.gathered_numel += out.segments[size_t(s)].layout.padded_numel;
    }
  }
  return out;
}

std::vector<PartitionFragment> Stage3Layout::fragments(int64_t group, int64_t rank) const {
  if (rank < 0 || rank >= world)
    throw Error("ZeRO-3 layout: rank " + std::to_string(rank) + " outside [0, " + std::to_string(world) + ")");
  std::vector<PartitionFragment> out;
  for (int64_t index : group_segments.at(size_t(group))) {
    const auto& s = segments[size_t(index)];
    const int64_t base = s.layout.partition_begin(rank);
    for (const auto& f : s.layout.fragments(rank))
      out.push_back({index_in_group[size_t(s.params[size_t(f.param_index)])], f.param_begin,
                     s.partition_offset + f.flat_begin - base, f.length});
  }
  return out;
}

int64_t Stage3Layout::weight_buffer_elements(int64_t group) const {
  const int64_t p = persistent_segment.at(size_t(group));
  return partition_numel.at(size_t(group)) + (p >= 0 ? segments[size_t(p)].layout.padded_numel : 0);
}

}  // namespace tessera::zero
