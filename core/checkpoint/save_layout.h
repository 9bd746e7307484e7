// Which rank writes which buffer, and the maps of the checkpoint storage (manifest.h) built from
// an engine's maps over data-parallel ranks. LibTorch-free: plain maps and names.
//
// Rules (each rank computes the same from the global maps; aliases are each rank's own facts):
//   - an alias (a buffer inside another of the same rank: fp32 masters are the weights' partition)
//     is never written; its maps point into the buffer it aliases, at its offset there;
//   - a replicated buffer (every rank's storage of every map into it is the same: the weights at
//     stages 0-2, everything at stage 0) is written by one rank, the replicated keys spread round
//     robin over the ranks; its maps keep only that rank's pieces;
//   - every other buffer is written by its rank.
// Example (stage 1, 2 ranks, fp32): "param/0" replicated, written by rank 0; "master/0" of rank 1
// aliases "param/0" of rank 1 at offset P (partition 1): its pieces move to file 0's "param/0" at
// offset + P (the same bytes, since the weights are replicated).
#pragma once

#include <cstdint>
#include <map>
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

  bool replicated(const std::string& key) const { return writer_.count(key) != 0; }
  // Whether `rank` writes its buffer `key` (given its own aliases).
  bool writes(int rank, const std::string& key, const RankAliases& aliases) const;
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
  int world_;
  std::map<std::string, int> writer_;  // replicated key -> the rank writing it
};

}  // namespace tessera::checkpoint
