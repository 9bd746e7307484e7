#include "core/affine/delta_packet.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "core/error.h"

namespace tessera::affine {
namespace {

// Calls row(first_element_offset, length, stride, position_of_first) for every innermost row of
// the segment's walk, on the source (source_side) or the target side.
template <class Row>
void for_each_row(const Segment& s, bool source_side, Row&& row) {
  const int64_t offset = source_side ? s.source_offset : s.target_offset;
  const Dims& strides = source_side ? s.source_strides : s.target_strides;
  const int nd = s.shape.size();
  if (s.elements() == 0) return;
  if (nd == 0) return row(offset, int64_t{1}, int64_t{1}, int64_t{0});
  Dims index(nd, 0);
  const int64_t inner = s.shape[nd - 1];
  for (int64_t position = 0;; position += inner) {
    int64_t at = offset;
    for (int k = 0; k < nd - 1; ++k) at += index[k] * strides[k];
    row(at, inner, strides[nd - 1], position);
    int k = nd - 2;
    while (k >= 0 && ++index[k] == s.shape[k]) index[k] = 0, --k;
    if (k < 0) return;
  }
}

void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + 4);
}

[[noreturn]] void malformed(const Plan& plan, int source_rank, int target_rank, const std::string& what) {
  throw TransportError("delta packet for tensor '" + plan.name + "' from source rank " + std::to_string(source_rank) +
                       " to target rank " + std::to_string(target_rank) + ": " + what);
}

// The elements of an 8-byte word (little-endian: element k in bits [8 es k, 8 es (k + 1))) whose bits
// differ, given diff = now ^ before: the top bit of each such element's lane set, the rest clear.
// (A lane is nonzero iff adding all-ones-but-the-top to its low bits carries into the top bit, or
// the top bit is set itself.)
template <int64_t es>
uint64_t changed_lanes(uint64_t diff) {
  static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "delta packets assume little-endian words");
  constexpr uint64_t top = es == 1 ? 0x8080808080808080ull
                           : es == 2 ? 0x8000800080008000ull
                           : es == 4 ? 0x8000000080000000ull
                                     : 0x8000000000000000ull;
  return (((diff & ~top) + ~top) | diff) & top;
}

// How many lanes changed_lanes marked: the marks shifted to each lane's bit 0, summed into the top
// lane by one multiplication (no popcount instruction needed; the build targets baseline x86-64).
template <int64_t es>
int64_t lane_count(uint64_t lanes) {
  constexpr int bits = 8 * es;
  if constexpr (es == 8) return int64_t(lanes >> 63);
  constexpr uint64_t ones = es == 1 ? 0x0101010101010101ull : es == 2 ? 0x0001000100010001ull : 0x0000000100000001ull;
  return int64_t(((lanes >> (bits - 1)) * ones) >> (64 - bits));
}

// Element bits compared as one unsigned word of the element's size.
// Returns false, with `packet` unchanged, when the segment's entry would pass `limit` bytes of packet.
// Positions are kept only while a sparse entry is still smaller than a dense one (and within the
// limit), so the scratch never outgrows the entry.
template <class Word>
bool append_segment(const Segment& s, const uint8_t* current, const uint8_t* last, std::vector<uint8_t>& packet,
                    int64_t limit, DeltaPacketStats& stats) {
  constexpr int64_t es = sizeof(Word);
  const int64_t n = s.elements();
  const int64_t room = limit - int64_t(packet.size()) - 4;  // after the entry's header
  if (room < 0) return false;
  const int64_t sparse_cap = std::min(n * es, room) / (4 + es);  // more changes: dense (or over the limit)
  std::vector<uint32_t> positions;
  int64_t changed = 0, seen = 0;
  // Set once the rows so far are dense (a sparse entry of them would be no smaller): from then on
  // changes are only counted and the segment goes whole. Either entry is exact, so deciding early
  // costs at most a whole segment where positions would have been smaller; it saves collecting
  // positions of a segment where most elements changed (fp32 after an Adam step).
  bool counting_only = false;
  auto note = [&](int64_t position) {
    if (changed++ < sparse_cap) positions.push_back(static_cast<uint32_t>(position));
  };
  auto compare = [&](int64_t e, int64_t position) {
    Word now, before;
    std::memcpy(&now, current + e, es);
    std::memcpy(&before, last + e, es);
    if (now != before) note(position);
  };
  for_each_row(s, true, [&](int64_t at, int64_t length, int64_t stride, int64_t position) {
    int64_t i = 0;
    if (stride == 1) {
      // Contiguous: a word of 8 bytes at a time, equal words skipped, the changed elements of a
      // word found (or only counted) without a branch per element.
      constexpr int64_t per_word = 8 / es;
      for (; i + per_word <= length; i += per_word) {
        uint64_t x, y;
        std::memcpy(&x, current + (at + i) * es, 8);
        std::memcpy(&y, last + (at + i) * es, 8);
        uint64_t lanes = changed_lanes<es>(x ^ y);
        if (!lanes) continue;
        if (counting_only || changed >= sparse_cap) {
          changed += lane_count<es>(lanes);
          continue;
        }
        for (; lanes; lanes &= lanes - 1) note(position + i + __builtin_ctzll(lanes) / (8 * es));
      }
    }
    for (; i < length; ++i) compare((at + i * stride) * es, position + i);
    seen += length;
    if (changed * (4 + es) >= seen * es) counting_only = true;
  });
  const bool dense = counting_only || changed * (4 + es) >= n * es;
  if ((dense ? n * es : changed * (4 + es)) > room) return false;
  stats.elements += n;
  stats.changed += changed;
  const size_t start = packet.size();
  if (dense) {
    ++stats.dense_segments;
    put_u32(packet, kDenseSegment);
    // Appended row by row in walk order (no zero-filled resize first: every byte is written once);
    // capacity grows geometrically, so a packet of many dense segments is not copied once per segment.
    const size_t needed = packet.size() + size_t(n * es);
    if (packet.capacity() < needed) packet.reserve(std::max(needed, 2 * packet.capacity()));
    for_each_row(s, true, [&](int64_t at, int64_t length, int64_t stride, int64_t) {
      const uint8_t* from = current + at * es;
      if (stride == 1) return void(packet.insert(packet.end(), from, from + length * es));
      for (int64_t i = 0; i < length; ++i, from += stride * es) packet.insert(packet.end(), from, from + es);
    });
  } else {
    put_u32(packet, static_cast<uint32_t>(positions.size()));
    for (uint32_t p : positions) put_u32(packet, p);
    // Values in position order: walk again, picking the changed ones.
    size_t next = 0;
    packet.resize(packet.size() + positions.size() * es);
    uint8_t* out = packet.data() + packet.size() - positions.size() * es;
    for_each_row(s, true, [&](int64_t at, int64_t length, int64_t stride, int64_t position) {
      while (next < positions.size() && positions[next] < position + length) {
        std::memcpy(out + next * es, current + (at + (positions[next] - position) * stride) * es, es);
        ++next;
      }
    });
  }
  stats.bytes += static_cast<int64_t>(packet.size() - start);
  return true;
}

// Target offset of the element at `position` of the segment's row-major walk.
int64_t target_address(const Segment& s, int64_t position) {
  int64_t at = s.target_offset;
  for (int k = s.shape.size() - 1; k >= 0; --k) {
    at += (position % s.shape[k]) * s.target_strides[k];
    position /= s.shape[k];
  }
  return at;
}

}  // namespace

bool append_delta(const Plan& plan, int source_rank, int target_rank, const LocalBuffer& current,
                  const LocalBuffer& last, std::vector<uint8_t>& packet, DeltaPacketStats& stats, int64_t limit_bytes) {
  const int64_t es = element_size(plan.dtype);
  const auto* now = static_cast<const uint8_t*>(current.data);
  const auto* before = static_cast<const uint8_t*>(last.data);
  for (const auto& s : plan.segments) {
    if (s.source_rank != source_rank || s.target_rank != target_rank) continue;
    if (s.elements() >= int64_t(kDenseSegment))
      throw TransportError("delta packet for tensor '" + plan.name + "': a segment of " + std::to_string(s.elements()) +
                           " elements is beyond 32-bit positions");
    bool fits = false;
    switch (es) {
      case 1: fits = append_segment<uint8_t>(s, now, before, packet, limit_bytes, stats); break;
      case 2: fits = append_segment<uint16_t>(s, now, before, packet, limit_bytes, stats); break;
      case 4: fits = append_segment<uint32_t>(s, now, before, packet, limit_bytes, stats); break;
      case 8: fits = append_segment<uint64_t>(s, now, before, packet, limit_bytes, stats); break;
      default: throw TransportError("delta packet: element size " + std::to_string(es) + " of '" + plan.name + "'");
    }
    if (!fits) return false;
  }
  return true;
}

size_t apply_delta(const Plan& plan, int source_rank, int target_rank, const uint8_t* packet, size_t size,
                   size_t cursor, const LocalBuffer& target) {
  const int64_t es = element_size(plan.dtype);
  auto* base = static_cast<uint8_t*>(target.data);
  auto need = [&](size_t bytes, const char* what) {
    if (size - cursor < bytes) malformed(plan, source_rank, target_rank, std::string("ends inside ") + what);
  };
  for (const auto& s : plan.segments) {
    if (s.source_rank != source_rank || s.target_rank != target_rank) continue;
    const int64_t n = s.elements();
    need(4, "a segment header");
    uint32_t count;
    std::memcpy(&count, packet + cursor, 4);
    cursor += 4;
    if (count == kDenseSegment) {
      need(size_t(n * es), "a whole segment");
      const uint8_t* in = packet + cursor;
      for_each_row(s, false, [&](int64_t at, int64_t length, int64_t stride, int64_t position) {
        if (stride == 1) return void(std::memcpy(base + at * es, in + position * es, size_t(length * es)));
        for (int64_t i = 0; i < length; ++i) std::memcpy(base + (at + i * stride) * es, in + (position + i) * es, es);
      });
      cursor += size_t(n * es);
      continue;
    }
    if (int64_t(count) > n) malformed(plan, source_rank, target_rank, "more changes than the segment has elements");
    need(size_t(count) * (4 + es), "its changes");
    const uint8_t* positions = packet + cursor;
    const uint8_t* values = positions + size_t(count) * 4;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t p;
      std::memcpy(&p, positions + size_t(i) * 4, 4);
      if (int64_t(p) >= n) malformed(plan, source_rank, target_rank, "a position outside its segment");
    }
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t p;
      std::memcpy(&p, positions + size_t(i) * 4, 4);
      std::memcpy(base + target_address(s, p) * es, values + size_t(i) * es, es);
    }
    cursor += size_t(count) * (4 + es);
  }
  return cursor;
}

}  // namespace tessera::affine
