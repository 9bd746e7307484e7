#include "core/checkpoint/save_layout.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::checkpoint {

SaveLayout::SaveLayout(const std::vector<EngineMap>& maps, int world) : world_(world) {
  if (world <= 1) return;  // one rank writes everything it has
  std::map<std::string, bool> same;  // per buffer key: every map's storage equal on all ranks
  for (const auto& m : maps) {
    auto [it, fresh] = same.emplace(m.buffer, true);
    if (!it->second) continue;
    const auto first = m.map.ranks.find(0);
    bool equal = first != m.map.ranks.end() && int(m.map.ranks.size()) == world;
    for (const auto& [rank, storage] : m.map.ranks) equal = equal && storage == first->second;
    it->second = equal;
  }
  int next = 0;
  for (const auto& [key, equal] : same)
    if (equal) writer_[key] = next++ % world_;
}

bool SaveLayout::writes(int rank, const std::string& key, const RankAliases& aliases) const {
  if (aliases.count(key)) return false;
  const auto it = writer_.find(key);
  return it == writer_.end() || it->second == rank;
}

SaveLayout::Place SaveLayout::resolve(int rank, const std::string& key, const std::map<int, RankAliases>& aliases) const {
  Place place{rank, key, 0};
  for (int hops = 0; hops < 8; ++hops) {
    const auto ra = aliases.find(place.rank);
    if (ra != aliases.end()) {
      const auto a = ra->second.find(place.key);
      if (a != ra->second.end()) {
        place.key = a->second.of, place.delta += a->second.offset;
        continue;
      }
    }
    const auto w = writer_.find(place.key);
    if (w != writer_.end()) place.rank = w->second;
    return place;
  }
  throw CheckpointError("checkpoint save: buffer '" + key + "' of rank " + std::to_string(rank) +
                        " aliases in a cycle");
}

std::vector<SavedMap> SaveLayout::saved_maps(const std::vector<EngineMap>& maps, const std::map<int, RankAliases>& aliases,
                                             const std::vector<RankFile>& files) const {
  std::vector<SavedMap> out;
  for (const auto& m : maps) {
    SavedMap s;
    s.kind = m.kind;
    s.map.name = m.map.name, s.map.dtype = m.map.dtype, s.map.shape = m.map.shape;
    const auto w = writer_.find(m.buffer);
    for (const auto& [rank, storage] : m.map.ranks) {
      if (w != writer_.end() && rank != w->second) continue;  // a replica: the writer's pieces stand for it
      if (storage.pieces.empty()) continue;
      const auto place = resolve(rank, m.buffer, aliases);
      auto& target = s.map.ranks[place.rank];
      for (auto piece : storage.pieces) {
        piece.offset += place.delta;
        if (w != writer_.end()) {
          piece.holders = {place.rank};
        } else {  // replicas (a ZeRO-3 persistent weight on every rank) stay replicas, in the files they went to
          std::set<int> holders;
          for (int h : piece.holders) holders.insert(resolve(h, m.buffer, aliases).rank);
          piece.holders.assign(holders.begin(), holders.end());
        }
        const bool known = std::any_of(target.pieces.begin(), target.pieces.end(), [&](const affine::Piece& p) {
          return p.box == piece.box && p.offset == piece.offset;
        });
        if (!known) target.pieces.push_back(std::move(piece));
      }
      const auto known = s.buffers.find(place.rank);
      if (known != s.buffers.end() && known->second != place.key)
        throw CheckpointError("checkpoint save: tensor '" + m.map.name + "' (" + m.kind + ") would address two buffers of file " +
                              std::to_string(place.rank));
      s.buffers[place.rank] = place.key;
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
