#include "core/affine/detail/map_checks.h"

#include <algorithm>

#include "core/affine/detail/strided_region.h"
#include "core/affine/errors.h"
#include "core/affine/nest.h"

namespace tessera::affine::detail {
namespace {

std::string where(const CheckedMap& c, int rank, const Box& box) {
  return describe(*c.map) + ": " + rank_label(c, rank) + " " + to_string(box);
}

void check_piece(const CheckedMap& c, int rank, const RankStorage& storage, const Piece& p) {
  const TensorMap& map = *c.map;
  const int ndim = map.shape.size();
  if (p.box.ndim() != ndim || p.box.origin.size() != ndim) {
    throw InvalidMapError(describe(map) + ": " + rank_label(c, rank) + " piece " + to_string(p.box) + " spans " +
                          std::to_string(p.box.ndim()) + " axes of a " + std::to_string(ndim) + "-axis tensor " +
                          to_string(map.shape));
  }
  if (p.strides.size() != ndim) {
    throw InvalidMapError(where(c, rank, p.box) + ": stride vector " + to_string(p.strides) + " has " +
                          std::to_string(p.strides.size()) + " entries, expected " + std::to_string(ndim));
  }
  for (int k = 0; k < ndim; ++k) {
    if (p.box.shape[k] < 0) throw InvalidMapError(where(c, rank, p.box) + ": negative extent on axis " + std::to_string(k));
  }
  if (p.box.is_empty()) return;  // covers nothing; its offset may legally be one past the end
  if (!Box::whole(map.shape).contains(p.box)) {
    throw InvalidMapError(where(c, rank, p.box) + " lies outside the tensor of shape " + to_string(map.shape));
  }
  if (p.holders.empty() || !std::is_sorted(p.holders.begin(), p.holders.end()) ||
      std::adjacent_find(p.holders.begin(), p.holders.end()) != p.holders.end() ||
      !std::binary_search(p.holders.begin(), p.holders.end(), rank)) {
    throw HolderError(where(c, rank, p.box) + " declares holders " + holders_label(p.holders) +
                      ", which must be sorted, unique and include the rank itself");
  }
  // Strides: non-negative, positive where the extent is > 1, and nesting so addresses are distinct.
  std::vector<std::pair<int64_t, int64_t>> axes;
  for (int k = 0; k < ndim; ++k) {
    if (p.strides[k] < 0 || (p.box.shape[k] > 1 && p.strides[k] == 0)) {
      throw UnsupportedLayoutError(where(c, rank, p.box) + ": strides " + to_string(p.strides) +
                                   " are not an axis-aligned layout (axis " + std::to_string(k) +
                                   " has stride " + std::to_string(p.strides[k]) + ")");
    }
    if (p.box.shape[k] > 1) axes.emplace_back(p.strides[k], p.box.shape[k]);
  }
  std::sort(axes.begin(), axes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t j = 0; j + 1 < axes.size(); ++j) {
    if (axes[j].first < axes[j + 1].first * axes[j + 1].second) {
      throw UnsupportedLayoutError(where(c, rank, p.box) + ": strides " + to_string(p.strides) +
                                   " are not an axis-aligned layout (two elements would share an address)");
    }
  }
  if (p.offset < 0 || p.last_address() >= storage.buffer_elements) {
    throw StorageOverlapError(where(c, rank, p.box) + " occupies storage addresses [" + std::to_string(p.offset) +
                              ", " + std::to_string(p.last_address() + 1) + "), outside the rank's buffer of " +
                              std::to_string(storage.buffer_elements) + " elements");
  }
}

// Exact union volume of boxes (recursive sweep; used only when distinct target boxes overlap).
int64_t union_volume(const std::vector<Box>& boxes, int axis, int64_t& budget) {
  if (boxes.empty()) return 0;
  const int ndim = boxes.front().ndim();
  if (axis == ndim) return 1;
  std::vector<int64_t> cuts;
  for (const auto& b : boxes) {
    cuts.push_back(b.origin[axis]);
    cuts.push_back(b.end(axis));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  int64_t total = 0;
  std::vector<Box> active;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) {
    active.clear();
    for (const auto& b : boxes) {
      if (b.origin[axis] <= cuts[i] && b.end(axis) >= cuts[i + 1]) active.push_back(b);
    }
    budget -= static_cast<int64_t>(boxes.size());
    if (budget < 0) {
      throw BudgetExceededError("the target coverage check of overlapping target replicas exceeded its budget");
    }
    if (!active.empty()) total += (cuts[i + 1] - cuts[i]) * union_volume(active, axis + 1, budget);
  }
  return total;
}

}  // namespace

std::string rank_label(const CheckedMap& c, int rank) { return c.role + " rank " + std::to_string(rank); }

std::string holders_label(const std::vector<int>& holders) {
  std::string out = "{";
  for (size_t i = 0; i < holders.size(); ++i) out += (i ? "," : "") + std::to_string(holders[i]);
  return out + "}";
}

CheckedMap check_map(const TensorMap& map, const std::string& role, bool allow_recut_replicas,
                     const CheckLimits& limits) {
  CheckedMap c;
  c.map = &map;
  c.role = role;
  if (map.shape.size() > kMaxDims) throw UnsupportedLayoutError(describe(map) + ": more than 8 axes");
  for (int k = 0; k < map.shape.size(); ++k) {
    if (map.shape[k] < 0) throw InvalidMapError(describe(map) + ": negative extent in shape " + to_string(map.shape));
  }
  c.pieces = map.piece_count();
  if (c.pieces > limits.max_pieces) {
    throw BudgetExceededError(describe(map) + ": the " + role + " map has " + std::to_string(c.pieces) +
                              " pieces, over the limit max_pieces = " + std::to_string(limits.max_pieces));
  }
  c.frames.reserve(static_cast<size_t>(c.pieces));
  std::vector<StridedRegion> regions;
  std::vector<const Piece*> nonempty;
  for (const auto& [rank, storage] : map.ranks) {
    if (storage.buffer_elements < 0) {
      throw InvalidMapError(describe(map) + ": " + rank_label(c, rank) + " declares a buffer of " +
                            std::to_string(storage.buffer_elements) + " elements");
    }
    if (!storage.buffer_shape.empty() && storage.buffer_shape.product() != storage.buffer_elements) {
      throw InvalidMapError(describe(map) + ": " + rank_label(c, rank) + " declares buffer shape " +
                            to_string(storage.buffer_shape) + " but " + std::to_string(storage.buffer_elements) +
                            " elements");
    }
    regions.clear();
    nonempty.clear();
    for (const auto& piece : storage.pieces) {
      check_piece(c, rank, storage, piece);
      if (piece.box.is_empty()) continue;
      nonempty.push_back(&piece);
      regions.push_back(StridedRegion{piece.offset, piece.box.shape, piece.strides, 1});
      c.frames.push_back(Frame{rank, &piece});
    }
    if (nonempty.size() < 2) continue;
    if (auto clash = find_overlap(regions, limits.max_overlap_runs)) {
      const Piece& a = *nonempty[clash->first];
      const Piece& b = *nonempty[clash->second];
      throw StorageOverlapError(describe(map) + ": " + rank_label(c, rank) + " pieces " + to_string(a.box) + " and " +
                                to_string(b.box) + " both occupy part of the same storage addresses");
    }
    std::vector<Box> boxes;
    boxes.reserve(nonempty.size());
    for (const Piece* p : nonempty) boxes.push_back(p->box);
    BoxIndex index(std::move(boxes));
    for (size_t i = 0; i < index.size(); ++i) {
      index.for_each_overlap(index.box(i), [&](size_t j, const Box&) {
        if (j != i) {
          throw InvalidMapError(describe(map) + ": " + rank_label(c, rank) + " holds overlapping logical pieces " +
                                to_string(index.box(std::min(i, j))) + " and " + to_string(index.box(std::max(i, j))));
        }
      });
    }
  }
  // Logical boxes of one rank, built only when a holder claim needs checking.
  std::map<int, BoxIndex> rank_index;
  auto held_volume = [&](int holder, const Box& box) -> int64_t {
    auto it = rank_index.find(holder);
    if (it == rank_index.end()) {
      std::vector<Box> boxes;
      auto st = map.ranks.find(holder);
      if (st != map.ranks.end()) {
        for (const auto& p : st->second.pieces)
          if (!p.box.is_empty()) boxes.push_back(p.box);
      }
      it = rank_index.emplace(holder, BoxIndex(std::move(boxes))).first;
    }
    return it->second.covered_volume(box);
  };
  std::sort(c.frames.begin(), c.frames.end(), [](const Frame& a, const Frame& b) {
    if (a.piece->box != b.piece->box) return a.piece->box < b.piece->box;
    return a.rank < b.rank;
  });
  // Groups of identical boxes = replicas; check declared holders.
  std::vector<int> ranks;
  for (size_t i = 0; i < c.frames.size();) {
    size_t j = i;
    ranks.clear();
    const Box& box = c.frames[i].piece->box;
    while (j < c.frames.size() && c.frames[j].piece->box == box) ranks.push_back(c.frames[j++].rank);
    c.group_begin.push_back(i);
    for (size_t f = i; f < j; ++f) {
      const Frame& frame = c.frames[f];
      const std::vector<int>& declared = frame.piece->holders;
      if (declared == ranks) continue;
      for (int holder : declared) {
        if (std::binary_search(ranks.begin(), ranks.end(), holder)) continue;
        const int64_t held = held_volume(holder, box);
        if (held < box.volume()) {
          throw HolderError(describe(map) + ": " + rank_label(c, holder) + " is named as a holder of " +
                            to_string(box) + " (by " + rank_label(c, frame.rank) + ") but does not hold it entirely (" +
                            std::to_string(held) + " of " + std::to_string(box.volume()) + " elements)");
        }
        if (!allow_recut_replicas) {
          throw UnsupportedLayoutError(describe(map) + ": replicas of " + to_string(box) + " on " +
                                       rank_label(c, frame.rank) + " and " + rank_label(c, holder) +
                                       " have different piece boundaries");
        }
      }
      for (int holder : ranks) {
        if (!std::binary_search(declared.begin(), declared.end(), holder)) {
          throw HolderError(describe(map) + ": replicas of " + to_string(box) +
                            " disagree about their holders (part of the tensor would have two owners): " +
                            rank_label(c, frame.rank) + " declares " + holders_label(declared) + " but " +
                            rank_label(c, holder) + " also holds it");
        }
      }
    }
    i = j;
  }
  c.group_begin.push_back(c.frames.size());
  return c;
}

namespace {

bool distinct_boxes_overlap(const CheckedMap& c) {
  std::vector<Box> boxes;
  for (size_t g = 0; g < c.groups(); ++g) boxes.push_back(c.group_box(g));
  const BoxIndex index(std::move(boxes));
  bool overlap = false;
  for (size_t g = 0; g < index.size() && !overlap; ++g) {
    index.for_each_overlap(index.box(g), [&](size_t h, const Box&) { overlap = overlap || h != g; });
  }
  return overlap;
}

}  // namespace

CheckedMap check_source_map(const TensorMap& map, const std::string& role, const CheckLimits& limits,
                            std::unique_ptr<TensorMap>& refined) {
  CheckedMap c = check_map(map, role, true, limits);
  if (!distinct_boxes_overlap(c)) return c;  // then no holder can hold a box in another cut either
  refined = std::make_unique<TensorMap>(map);
  cut_replicas_to_common_boxes(*refined);
  return check_map(*refined, role, false, limits);
}

BoxIndex check_source_regions(const CheckedMap& c) {
  std::vector<Box> boxes;
  boxes.reserve(c.groups());
  int64_t covered = 0;
  for (size_t g = 0; g < c.groups(); ++g) {
    boxes.push_back(c.group_box(g));
    covered += boxes.back().volume();
  }
  BoxIndex index(std::move(boxes));
  for (size_t g = 0; g < index.size(); ++g) {
    index.for_each_overlap(index.box(g), [&](size_t h, const Box&) {
      if (h == g) return;
      const Frame& a = c.frames[c.group_begin[std::min(g, h)]];
      const Frame& b = c.frames[c.group_begin[std::max(g, h)]];
      if (a.piece->holders != b.piece->holders) {
        throw HolderError(describe(*c.map) + ": " + c.role + " boxes " + to_string(a.piece->box) + " held by " +
                          holders_label(a.piece->holders) + " and " + to_string(b.piece->box) + " held by " +
                          holders_label(b.piece->holders) + " overlap, so part of the tensor has two owners (" +
                          rank_label(c, a.rank) + ", " + rank_label(c, b.rank) + ")");
      }
      throw UnsupportedLayoutError(describe(*c.map) + ": " + c.role + " replicas of " + to_string(a.piece->box) +
                                   " and " + to_string(b.piece->box) + " (" + rank_label(c, a.rank) + ", " +
                                   rank_label(c, b.rank) + ") have different piece boundaries");
    });
  }
  const int64_t numel = c.map->numel();
  if (covered != numel) {
    throw CoverageError(describe(*c.map) + ": " + c.role + " pieces cover " + std::to_string(covered) + " of its " +
                        std::to_string(numel) + " logical elements " + to_string(c.map->shape));
  }
  return index;
}

void check_target_coverage(const CheckedMap& c) {
  std::vector<Box> boxes;
  boxes.reserve(c.groups());
  int64_t sum = 0;
  for (size_t g = 0; g < c.groups(); ++g) {
    boxes.push_back(c.group_box(g));
    sum += boxes.back().volume();
  }
  const int64_t numel = c.map->numel();
  bool overlapping = false;
  {
    BoxIndex index(boxes);
    for (size_t g = 0; g < index.size() && !overlapping; ++g) {
      index.for_each_overlap(index.box(g), [&](size_t h, const Box&) { overlapping = overlapping || h != g; });
    }
  }
  int64_t covered = sum;
  if (overlapping) {
    int64_t budget = int64_t{1} << 26;
    covered = union_volume(boxes, 0, budget);
  }
  if (covered != numel) {
    throw CoverageError(describe(*c.map) + ": " + c.role + " pieces do not cover the tensor: they cover " +
                        std::to_string(covered) + " of its " + std::to_string(numel) + " logical elements " +
                        to_string(c.map->shape));
  }
}

}  // namespace tessera::affine::detail
