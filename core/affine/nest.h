// nest() composes a layout map (tensor -> layout ranks, e.g. TP shards) with per-shard storage maps
// (shard -> storage ranks, e.g. ZeRO partitions of that shard) into one storage map of the tensor
// over global ranks, then re-folds it so piece counts stay small.
//
// Contract: layout rank t's buffer is a row-major tensor of shape storage_per_shard.at(t).shape (its
// buffer_shape when declared; a flat layout buffer needs a 1-D storage map); each layout piece must be
// a box of that shard (row-major strides on every axis of extent > 1). global rank =
// rank_of(t, s) for storage rank s of shard t; two (t, s) must not name the same global rank.
// Holders are recomputed: global ranks storing exactly the same box (TP replicas x DP replicas),
// after replicas cut differently are cut to common boxes (cut_replicas_to_common_boxes).
// refold() merges pieces of one rank that are adjacent along an axis in the tensor and continue in
// storage with the same strides and holders.
//
// Example: a (8, 4) weight split by rows over TP2 (shards (4, 4)), each shard in ZeRO-3 over DP2
// (P = 8 elements), global rank = t * 2 + s: global rank 1 holds shard 0's elements [8, 16), i.e.
// Box((2,0)+(2,4)) at offset 0 with strides (4,1); global rank 3 holds Box((6,0)+(2,4)).
#pragma once

#include <functional>
#include <map>

#include "core/affine/affine_map.h"

namespace tessera::affine {

using RankOf = std::function<int(int layout_rank, int storage_rank)>;

TensorMap nest(const TensorMap& layout, const std::map<int, TensorMap>& storage_per_shard, const RankOf& rank_of);

// Cuts pieces so that any two boxes of the map (on any ranks) are either equal or disjoint: replicas
// of one region stored with different cuts (a replicated segment inside TP shards of different sizes,
// each shard partitioned by ZeRO on its own) become common cells, so holders are exact per box.
// Iterated to a fixpoint; adds pieces only where replicas disagree.
void cut_replicas_to_common_boxes(TensorMap& map);

// Merges continuing pieces of each rank (see above) to a fixpoint; O(n) expected per pass.
void refold(TensorMap& map);

}  // namespace tessera::affine
