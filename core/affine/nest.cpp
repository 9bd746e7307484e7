#include "core/affine/nest.h"

#include <algorithm>
#include <unordered_map>

#include "core/affine/detail/box_index.h"
#include "core/affine/detail/digest.h"
#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

// A layout piece as a box of its shard (the shard being a row-major tensor of shape `shard`).
Box shard_box(const TensorMap& layout, int t, const Piece& p, const Dims& shard) {
  const Dims strides = row_major_strides(shard);
  const std::string where = describe(layout) + ": layout rank " + std::to_string(t) + " piece " + to_string(p.box);
  if (shard.size() != p.box.ndim()) {
    throw UnsupportedLayoutError(where + " has " + std::to_string(p.box.ndim()) + " axes but its shard's storage map " +
                                 "describes shape " + to_string(shard));
  }
  Box out(Dims(shard.size()), p.box.shape);
  int64_t rest = p.offset;
  for (int k = 0; k < shard.size(); ++k) {
    out.origin[k] = rest / strides[k];
    rest %= strides[k];
    if (p.box.shape[k] > 1 && p.strides[k] != strides[k]) {
      throw UnsupportedLayoutError(where + " has strides " + to_string(p.strides) + ", not the row-major strides " +
                                   to_string(strides) + " of its shard " + to_string(shard));
    }
  }
  if (!Box::whole(shard).contains(out)) {
    throw InvalidMapError(where + " at offset " + std::to_string(p.offset) + " lies outside its shard " + to_string(shard));
  }
  return out;
}

struct FoldKey {
  int axis;
  Dims origin, shape, strides;  // origin[axis] and shape[axis] zeroed
  int64_t offset;
  const std::vector<int>* holders;
  bool operator==(const FoldKey& o) const {
    return axis == o.axis && origin == o.origin && shape == o.shape && strides == o.strides && offset == o.offset &&
           *holders == *o.holders;
  }
};
struct FoldHash {
  size_t operator()(const FoldKey& k) const {
    detail::Fnv64 h;
    h.add_signed(k.axis);
    h.add(k.origin);
    h.add(k.shape);
    h.add(k.strides);
    h.add_signed(k.offset);
    for (int r : *k.holders) h.add_signed(r);
    return static_cast<size_t>(h.value());
  }
};

FoldKey fold_key(const Piece& p, int axis, bool continuation) {
  FoldKey k{axis, p.box.origin, p.box.shape, p.strides, p.offset, &p.holders};
  k.origin[axis] = continuation ? p.box.end(axis) : p.box.origin[axis];
  k.shape[axis] = 0;
  if (continuation) k.offset += p.box.shape[axis] * p.strides[axis];
  return k;
}

bool fold_along(std::vector<Piece>& pieces, int axis) {
  std::unordered_map<FoldKey, size_t, FoldHash> starts;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].box.is_empty()) starts.emplace(fold_key(pieces[i], axis, false), i);
  }
  const size_t none = pieces.size();
  std::vector<size_t> next(pieces.size(), none);
  std::vector<char> has_prev(pieces.size(), 0);
  bool any = false;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].box.is_empty()) continue;
    auto it = starts.find(fold_key(pieces[i], axis, true));
    if (it != starts.end() && it->second != i && !has_prev[it->second]) {
      next[i] = it->second;
      has_prev[it->second] = 1;
      any = true;
    }
  }
  if (!any) return false;
  std::vector<Piece> out;
  std::vector<char> used(pieces.size(), 0);
  auto chain = [&](size_t head) {
    Piece p = pieces[head];
    used[head] = 1;
    for (size_t j = next[head]; j != none && !used[j]; j = next[j]) {
      p.box.shape[axis] += pieces[j].box.shape[axis];
      used[j] = 1;
    }
    out.push_back(std::move(p));
  };
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!has_prev[i]) chain(i);
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!used[i]) chain(i);
  }
  pieces.swap(out);
  return true;
}

}  // namespace

void refold(TensorMap& map) {
  for (auto& [rank, storage] : map.ranks) {
    auto& pieces = storage.pieces;
    pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const Piece& p) { return p.box.is_empty(); }),
                 pieces.end());
    bool changed = true;
    while (changed) {
      changed = false;
      for (int axis = map.shape.size() - 1; axis >= 0; --axis) changed = fold_along(pieces, axis) || changed;
    }
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.offset < b.offset; });
  }
}

void cut_replicas_to_common_boxes(TensorMap& map) {
  for (;;) {
    std::vector<Box> boxes;
    std::vector<std::pair<int, size_t>> where;  // (rank, piece index)
    for (const auto& [rank, storage] : map.ranks) {
      for (size_t i = 0; i < storage.pieces.size(); ++i) {
        if (storage.pieces[i].box.is_empty()) continue;
        boxes.push_back(storage.pieces[i].box);
        where.emplace_back(rank, i);
      }
    }
    const detail::BoxIndex index(boxes);
    std::map<int, std::vector<Piece>> replaced;  // rank -> new piece list (only ranks that changed)
    bool changed = false;
    for (size_t b = 0; b < index.size(); ++b) {
      const Box& box = index.box(b);
      std::vector<std::vector<int64_t>> cuts(static_cast<size_t>(box.ndim()));
      index.for_each_overlap(box, [&](size_t o, const Box&) {
        const Box& other = index.box(o);
        if (other == box) return;
        for (int k = 0; k < box.ndim(); ++k) {
          for (int64_t c : {other.origin[k], other.end(k)}) {
            if (c > box.origin[k] && c < box.end(k)) cuts[static_cast<size_t>(k)].push_back(c);
          }
        }
      });
      bool any = false;
      for (auto& axis_cuts : cuts) {
        std::sort(axis_cuts.begin(), axis_cuts.end());
        axis_cuts.erase(std::unique(axis_cuts.begin(), axis_cuts.end()), axis_cuts.end());
        any = any || !axis_cuts.empty();
      }
      const auto [rank, piece_index] = where[b];
      auto& list = replaced.try_emplace(rank).first->second;
      const Piece& piece = map.ranks[rank].pieces[piece_index];
      if (!any) {
        list.push_back(piece);
        continue;
      }
      changed = true;
      // Cells of the grid the cuts make inside the box, row-major.
      std::vector<std::vector<std::pair<int64_t, int64_t>>> intervals(static_cast<size_t>(box.ndim()));
      for (int k = 0; k < box.ndim(); ++k) {
        int64_t at = box.origin[k];
        for (int64_t c : cuts[static_cast<size_t>(k)]) {
          intervals[static_cast<size_t>(k)].emplace_back(at, c - at);
          at = c;
        }
        intervals[static_cast<size_t>(k)].emplace_back(at, box.end(k) - at);
      }
      std::vector<size_t> pick(static_cast<size_t>(box.ndim()), 0);
      for (;;) {
        Piece cell = piece;
        for (int k = 0; k < box.ndim(); ++k) {
          cell.box.origin[k] = intervals[static_cast<size_t>(k)][pick[static_cast<size_t>(k)]].first;
          cell.box.shape[k] = intervals[static_cast<size_t>(k)][pick[static_cast<size_t>(k)]].second;
        }
        cell.offset = piece.address_of(cell.box.origin);
        list.push_back(cell);
        int k = box.ndim() - 1;
        for (; k >= 0; --k) {
          if (++pick[static_cast<size_t>(k)] < intervals[static_cast<size_t>(k)].size()) break;
          pick[static_cast<size_t>(k)] = 0;
        }
        if (k < 0) break;
      }
    }
    if (!changed) return;
    for (auto& [rank, pieces] : replaced) map.ranks[rank].pieces = std::move(pieces);
  }
}

TensorMap nest(const TensorMap& layout, const std::map<int, TensorMap>& storage_per_shard, const RankOf& rank_of) {
  TensorMap out;
  out.name = layout.name;
  out.dtype = layout.dtype;
  out.shape = layout.shape;
  std::map<int, std::pair<int, int>> origin_of;  // global rank -> (layout rank, storage rank)
  for (const auto& [t, layout_storage] : layout.ranks) {
    auto found = storage_per_shard.find(t);
    if (found == storage_per_shard.end()) {
      throw InvalidMapError(describe(layout) + ": no storage map for layout rank " + std::to_string(t));
    }
    const TensorMap& inner = found->second;
    if (inner.numel() != layout_storage.buffer_elements) {
      throw InvalidMapError(describe(layout) + ": layout rank " + std::to_string(t) + " stores " +
                            std::to_string(layout_storage.buffer_elements) + " elements but its storage map describes " +
                            to_string(inner.shape));
    }
    std::vector<Box> inner_boxes;
    std::vector<std::pair<int, const Piece*>> inner_pieces;
    for (const auto& [s, storage] : inner.ranks) {
      const int g = rank_of(t, s);
      auto [it, inserted] = origin_of.emplace(g, std::make_pair(t, s));
      if (!inserted) {
        throw InvalidMapError(describe(layout) + ": rank_of maps (layout rank " + std::to_string(it->second.first) +
                              ", storage rank " + std::to_string(it->second.second) + ") and (layout rank " +
                              std::to_string(t) + ", storage rank " + std::to_string(s) + ") to global rank " +
                              std::to_string(g));
      }
      out.ranks[g].buffer_elements = storage.buffer_elements;
      out.ranks[g].buffer_shape = storage.buffer_shape;
      for (const auto& p : storage.pieces) {
        if (p.box.is_empty()) continue;
        inner_boxes.push_back(p.box);
        inner_pieces.emplace_back(g, &p);
      }
    }
    detail::BoxIndex index(std::move(inner_boxes));
    for (const auto& lp : layout_storage.pieces) {
      if (lp.box.is_empty()) continue;
      const Box in_shard = shard_box(layout, t, lp, inner.shape);
      index.for_each_overlap(in_shard, [&](size_t i, const Box& d) {
        const auto& [g, ip] = inner_pieces[i];
        Piece p;
        p.box = d;
        for (int k = 0; k < d.ndim(); ++k) p.box.origin[k] = lp.box.origin[k] + (d.origin[k] - in_shard.origin[k]);
        p.offset = ip->address_of(d.origin);
        p.strides = ip->strides;
        p.holders = {g};
        out.ranks[g].pieces.push_back(p);
      });
    }
  }
  refold(out);
  cut_replicas_to_common_boxes(out);
  assign_holders_by_box(out);
  return out;
}

}  // namespace tessera::affine
