// Which rank writes which buffer, and the maps of the checkpoint storage (manifest.h) built from
// an engine's maps over data-parallel ranks. LibTorch-free: plain maps and names.
//
// Rules (each rank computes the same from the global maps; aliases are each rank's own facts):
//   - an alias (a buffer inside another of the same rank: fp32 masters are the weights' partition)
//     is never written; its maps point into the buffer it aliases, at its offset there;
//   - a replicated buffer (every rank's storage of every map into it is the same: the weights at
//     stages 0-2, everything at stage 0) is written once, in W even slices, rank r writing slice r
//     (so no rank writes more than its share); its maps keep one copy of each piece, cut at the
//     slices' edges (run_boxes), each part in the file of the slice that holds it;
//   - every other buffer is written by its rank (a map replicated inside it, a ZeRO-3 persistent
//     weight, keeps its replicas).
// Example (stage 1, 2 ranks, fp32, 10 weights): "param/0" replicated: rank 0 writes elements
// [0, 5), rank 1 [5, 10); "master/0" of rank 1 aliases "param/0" at offset 5: its pieces land in
// file 1's slice at offset 0 (the same bytes, since the weights are replicated).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/checkpoint/manifest.h"

namespace tessera::checkpoint {

struct EngineMap {
  std::string kind;
  std::string buffer;      // every rank's pieces address this buffer key
  affine::TensorMap map;   // over data-parallel ranks
};

struct BufferAlias {
  std::string of;          // the buffer it lies inside (same rank)
  int64_t offset = 0;      // in elements of that buffer
};

using RankAliases = std::map<std::string, BufferAlias>;  // by alias key

class SaveLayout {
 public:
  SaveLayout(const std::vector<EngineMap>& maps, int world);

  bool replicated(const std::string& key) const { return slices_.count(key) != 0; }
  // The elements [begin, end) of buffer `key` that `rank` writes; nullopt: none (an alias).
  std::optional<std::pair<int64_t, int64_t>> written_range(int rank, const std::string& key, int64_t elements,
                                                           const RankAliases& aliases) const;
  // The checkpoint's maps, given every rank's aliases and every file's buffers (for sizes).
  std::vector<SavedMap> saved_maps(const std::vector<EngineMap>& maps, const std::map<int, RankAliases>& aliases,
                                   const std::vector<RankFile>& files) const;

 private:
  struct Place {
    int rank;
    std::string key;
    int64_t delta;
  };
  Place resolve(int rank, const std::string& key, const std::map<int, RankAliases>& aliases) const;
  std::pair<int64_t, int64_t> slice(const std::string& key, int rank) const;
  int world_;
  std::map<std::string, int64_t> slices_;  // replicated key -> its elements (cut in world_ even slices)
};

}  // namespace tessera::checkpoint
