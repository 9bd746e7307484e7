#include "core/checkpoint/save_layout.h"

#include <algorithm>
#include <set>

#include "core/affine/run_boxes.h"
#include "core/error.h"

namespace tessera::checkpoint {

namespace {

// Pieces whose storage is dense in the box's row-major order (run boxes of a flat buffer) can be
// cut at any address; others cannot.
bool dense(const affine::Piece& p) {
  int64_t expected = 1;
  for (int k = p.box.ndim() - 1; k >= 0; --k) {
    if (p.box.shape[k] > 1 && p.strides[k] != expected) return false;
    expected *= p.box.shape[k];
  }
  return true;
}

}  // namespace

SaveLayout::SaveLayout(const std::vector<EngineMap>& maps, int world) : world_(world) {
  if (world <= 1) return;  // one rank writes everything it has
  std::map<std::string, bool> same;  // per buffer key: every map's storage equal on all ranks, cuttable
  std::map<std::string, int64_t> elements;
  for (const auto& m : maps) {
    auto [it, fresh] = same.emplace(m.buffer, true);
    if (!it->second) continue;
    const auto first = m.map.ranks.find(0);
    bool equal = first != m.map.ranks.end() && int(m.map.ranks.size()) == world;
    for (const auto& [rank, storage] : m.map.ranks) equal = equal && storage == first->second;
    if (equal)
      for (const auto& piece : first->second.pieces) equal = equal && dense(piece);
    it->second = equal;
    if (equal) elements[m.buffer] = first->second.buffer_elements;
  }
  for (const auto& [key, equal] : same)
    if (equal) slices_[key] = elements[key];
}

std::pair<int64_t, int64_t> SaveLayout::slice(const std::string& key, int rank) const {
  const int64_t n = slices_.at(key), share = (n + world_ - 1) / world_;
  return {std::min(n, rank * share), std::min(n, (rank + 1) * share)};
}

std::optional<std::pair<int64_t, int64_t>> SaveLayout::written_range(int rank, const std::string& key, int64_t elements,
                                                                     const RankAliases& aliases) const {
  if (aliases.count(key)) return std::nullopt;
  if (!replicated(key)) return std::pair<int64_t, int64_t>{0, elements};
  if (slices_.at(key) != elements)
    throw CheckpointError("checkpoint save: buffer '" + key + "' has " + std::to_string(elements) +
                          " elements on rank " + std::to_string(rank) + ", its maps say " + std::to_string(slices_.at(key)));
  return slice(key, rank);
}

SaveLayout::Place SaveLayout::resolve(int rank, const std::string& key, const std::map<int, RankAliases>& aliases) const {
  Place place{rank, key, 0};
  for (int hops = 0; hops < 8; ++hops) {
    const auto ra = aliases.find(place.rank);
    if (ra == aliases.end()) return place;
    const auto a = ra->second.find(place.key);
    if (a == ra->second.end()) return place;
    place.key = a->second.of, place.delta += a->second.offset;
  }
  throw CheckpointError("checkpoint save: buffer '" + key + "' of rank " + std::to_string(rank) + " aliases in a cycle");
}

std::vector<SavedMap> SaveLayout::saved_maps(const std::vector<EngineMap>& maps, const std::map<int, RankAliases>& aliases,
                                             const std::vector<RankFile>& files) const {
  std::vector<SavedMap> out;
  for (const auto& m : maps) {
    SavedMap s;
    s.kind = m.kind;
    s.map.name = m.map.name, s.map.dtype = m.map.dtype, s.map.shape = m.map.shape;
    auto add = [&](int file_rank, const std::string& key, affine::Piece piece) {
      const auto known = s.buffers.find(file_rank);
      if (known != s.buffers.end() && known->second != key)
        throw CheckpointError("checkpoint save: tensor '" + m.map.name + "' (" + m.kind + ") would address two buffers of file " +
                              std::to_string(file_rank));
      s.buffers[file_rank] = key;
      auto& pieces = s.map.ranks[file_rank].pieces;
      const bool known_piece = std::any_of(pieces.begin(), pieces.end(), [&](const affine::Piece& p) {
        return p.box == piece.box && p.offset == piece.offset;
      });
      if (!known_piece) pieces.push_back(std::move(piece));
    };
    const bool replicated_map = replicated(m.buffer);
    for (const auto& [rank, storage] : m.map.ranks) {
      if (replicated_map && rank != m.map.ranks.begin()->first) continue;  // one copy stands for all
      const auto place = resolve(rank, m.buffer, aliases);
      for (const auto& original : storage.pieces) {
        if (original.box.is_empty()) continue;
        if (!replicated(place.key)) {  // in its rank's file; replicas stay replicas
          auto piece = original;
          piece.offset += place.delta;
          std::set<int> holders;
          for (int h : piece.holders) holders.insert(resolve(h, m.buffer, aliases).rank);
          piece.holders.assign(holders.begin(), holders.end());
          add(place.rank, place.key, std::move(piece));
          continue;
        }
        if (!dense(original))
          throw CheckpointError("checkpoint save: tensor '" + m.map.name + "' (" + m.kind +
                                ") is strided inside a replicated buffer; it cannot be cut into slices");
        // Cut at the slices' edges: each part goes to the file of the slice holding it.
        const int64_t begin = original.offset + place.delta, volume = original.box.volume();
        for (int w = 0; w < world_; ++w) {
          const auto [lo, hi] = slice(place.key, w);
          const int64_t from = std::max(lo, begin) - begin, to = std::min(hi, begin + volume) - begin;
          if (from >= to) continue;
          for (const auto& part : affine::run_boxes(original.box.shape, from, to)) {
            affine::Piece piece;
            affine::Dims origin = original.box.origin;
            for (int k = 0; k < origin.size(); ++k) origin[k] += part.origin[k];
            piece.box = affine::Box(origin, part.shape);
            piece.offset = begin + affine::linear_index(original.box.shape, part.origin) - lo;
            piece.strides = original.strides;
            piece.holders = {w};
            add(w, place.key, std::move(piece));
          }
        }
      }
    }
    for (auto& [rank, storage] : s.map.ranks) {
      const SavedBuffer* buffer = nullptr;
      for (const auto& f : files)
        if (f.rank == rank) buffer = f.find(s.buffers.at(rank));
      if (!buffer)
        throw CheckpointError("checkpoint save: tensor '" + m.map.name + "' (" + m.kind + ") lies in buffer '" +
                              s.buffers.at(rank) + "' of rank " + std::to_string(rank) + ", which no rank wrote");
      storage.buffer_elements = buffer->elements;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace tessera::checkpoint
