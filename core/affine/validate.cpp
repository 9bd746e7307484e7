#include "core/affine/validate.h"

#include <memory>

#include "core/affine/detail/map_checks.h"

namespace tessera::affine {

MapSummary validate_map(const TensorMap& map, const ValidateOptions& options) {
  detail::CheckLimits limits;
  limits.max_pieces = options.max_pieces;
  std::unique_ptr<TensorMap> refined;
  const detail::CheckedMap checked = detail::check_source_map(map, "map", limits, refined);
  if (options.require_coverage) detail::check_source_regions(checked);
  MapSummary summary;
  summary.pieces = checked.pieces;
  summary.nonempty_pieces = static_cast<int64_t>(checked.frames.size());
  summary.regions = static_cast<int64_t>(checked.groups());  // cells, when replicas were cut differently
  for (size_t g = 0; g < checked.groups(); ++g) summary.covered_elements += checked.group_box(g).volume();
  for (const auto& [rank, storage] : map.ranks) {
    summary.pieces_per_rank[rank] = static_cast<int64_t>(storage.pieces.size());
    int64_t elements = 0;
    for (const auto& p : storage.pieces) elements += p.box.volume();
    summary.elements_per_rank[rank] = elements;
  }
  return summary;
}

}  // namespace tessera::affine
