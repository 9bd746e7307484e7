// Delta packets carry, for one (source rank, target rank) pair of a batch of plans, only the
// elements whose bits changed since the last sync: an exact delta (verl's delta mode), applied on
// top of the target's copy of the last synced version, gives bit for bit what a full transfer of
// the same plans gives.
//
// Both ends walk the pair's segments in plan order and, inside a segment, its elements in
// row-major index order (the order segment_digest.h hashes in). Per segment the packet holds
//   u32 count, then count u32 positions (index in that walk) and count values;  or
//   u32 kDenseSegment, then every element's value (when that is no larger: many changed).
// So a packet is at most the pair's full bytes plus 4 bytes per segment, and with few changes about
// (4 + element size) bytes per changed element.
//
// Example: bf16 weights where 2% of 1,000,000 elements changed: about 20,000 * 6 = 120 KB instead of
// the full 2 MB (16.7x less on the wire).
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "core/affine/local_executor.h"
#include "core/affine/plan.h"

namespace tessera::affine {

constexpr uint32_t kDenseSegment = 0xffffffffu;

struct DeltaPacketStats {
  int64_t elements = 0;        // elements the pair's segments cover
  int64_t changed = 0;         // of those, elements whose bits differ from the last sync
  int64_t dense_segments = 0;  // segments sent whole
  int64_t bytes = 0;           // packet bytes appended
};

// Appends to `packet` the pair's entries of `plan`: `current` and `last` are the source rank's
// buffer now and at the last sync (same layout). `last` is only read (a source element may go to
// several targets); the caller makes it current once every packet is built. Returns false as soon
// as the next entry would take `packet` past `limit_bytes` (a staging budget): the packet then ends
// after the last entry that fitted, is not a valid delta, and the caller sends the full plan
// instead. Neither the packet nor the scratch of one segment outgrows the limit.
bool append_delta(const Plan& plan, int source_rank, int target_rank, const LocalBuffer& current,
                  const LocalBuffer& last, std::vector<uint8_t>& packet, DeltaPacketStats& stats,
                  int64_t limit_bytes = std::numeric_limits<int64_t>::max());

// Reads the pair's entries of `plan` from packet[cursor...] and writes them into the target rank's
// buffer, which must hold the last synced version. Returns the cursor after them. A packet that
// ends early, or a position or count outside its segment, is a TransferError (naming the tensor and
// both ranks) before that segment is written.
size_t apply_delta(const Plan& plan, int source_rank, int target_rank, const uint8_t* packet, size_t size,
                   size_t cursor, const LocalBuffer& target);

}  // namespace tessera::affine
