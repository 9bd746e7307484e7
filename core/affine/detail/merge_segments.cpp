#include "core/affine/detail/merge_segments.h"

#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "core/affine/detail/digest.h"

namespace tessera::affine::detail {
namespace {

// Everything but the offsets and shape[axis] identifies which segments may merge along `axis`.
struct Key {
  int source_rank, target_rank, axis;
  int64_t source_offset, target_offset;
  Dims source_strides, target_strides, shape;  // shape[axis] zeroed
  bool operator==(const Key& o) const {
    return source_rank == o.source_rank && target_rank == o.target_rank && axis == o.axis &&
           source_offset == o.source_offset && target_offset == o.target_offset &&
           source_strides == o.source_strides && target_strides == o.target_strides && shape == o.shape;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    Fnv64 h;
    h.add_signed(k.source_rank);
    h.add_signed(k.target_rank);
    h.add_signed(k.axis);
    h.add_signed(k.source_offset);
    h.add_signed(k.target_offset);
    h.add(k.source_strides);
    h.add(k.target_strides);
    h.add(k.shape);
    return static_cast<size_t>(h.value());
  }
};

Key key_of(const Segment& s, int axis, bool continuation) {
  Key k{s.source_rank, s.target_rank, axis, s.source_offset, s.target_offset, s.source_strides, s.target_strides, s.shape};
  k.shape[axis] = 0;
  if (continuation) {
    k.source_offset += s.shape[axis] * s.source_strides[axis];
    k.target_offset += s.shape[axis] * s.target_strides[axis];
  }
  return k;
}

// One pass along `axis`; returns true when anything merged.
bool merge_along(std::vector<Segment>& segments, int axis) {
  std::unordered_map<Key, size_t, KeyHash> starts;
  starts.reserve(segments.size() * 2);
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].shape.size() > axis) starts.emplace(key_of(segments[i], axis, false), i);
  }
  if (starts.empty()) return false;
  const size_t none = segments.size();
  std::vector<size_t> next(segments.size(), none);
  std::vector<char> has_prev(segments.size(), 0);
  bool any = false;
  for (size_t i = 0; i < segments.size(); ++i) {
    if (segments[i].shape.size() <= axis) continue;
    auto it = starts.find(key_of(segments[i], axis, true));
    if (it != starts.end() && it->second != i && !has_prev[it->second]) {
      next[i] = it->second;
      has_prev[it->second] = 1;
      any = true;
    }
  }
  if (!any) return false;
  std::vector<Segment> merged;
  merged.reserve(segments.size());
  std::vector<char> used(segments.size(), 0);
  auto take_chain = [&](size_t head) {
    Segment s = segments[head];
    used[head] = 1;
    for (size_t j = next[head]; j != none && !used[j]; j = next[j]) {
      s.shape[axis] += segments[j].shape[axis];
      used[j] = 1;
    }
    collapse(s);
    merged.push_back(s);
  };
  for (size_t i = 0; i < segments.size(); ++i) {
    if (!has_prev[i]) take_chain(i);
  }
  for (size_t i = 0; i < segments.size(); ++i) {  // pure cycles cannot occur (offsets grow); be safe
    if (!used[i]) take_chain(i);
  }
  segments.swap(merged);
  return true;
}

}  // namespace

void collapse(Segment& s) {
  Segment out = s;
  out.shape = Dims();
  out.source_strides = Dims();
  out.target_strides = Dims();
  for (int k = 0; k < s.shape.size(); ++k) {
    if (s.shape[k] == 1) continue;
    const int last = out.shape.size() - 1;
    if (last >= 0 && out.source_strides[last] == s.source_strides[k] * s.shape[k] &&
        out.target_strides[last] == s.target_strides[k] * s.shape[k]) {
      out.shape[last] *= s.shape[k];
      out.source_strides[last] = s.source_strides[k];
      out.target_strides[last] = s.target_strides[k];
      continue;
    }
    out.shape.push_back(s.shape[k]);
    out.source_strides.push_back(s.source_strides[k]);
    out.target_strides.push_back(s.target_strides[k]);
  }
  if (out.shape.size() == 0) {  // a single element
    out.shape.push_back(1);
    out.source_strides.push_back(1);
    out.target_strides.push_back(1);
  }
  s = out;
}

namespace {

// b continues a along `axis` on both sides, with equal other extents and strides.
bool continues(const Segment& a, const Segment& b, int axis) {
  if (a.source_rank != b.source_rank || a.target_rank != b.target_rank || a.shape.size() != b.shape.size() ||
      a.source_strides != b.source_strides || a.target_strides != b.target_strides) {
    return false;
  }
  for (int k = 0; k < a.shape.size(); ++k) {
    if (k != axis && a.shape[k] != b.shape[k]) return false;
  }
  return a.source_offset + a.shape[axis] * a.source_strides[axis] == b.source_offset &&
         a.target_offset + a.shape[axis] * a.target_strides[axis] == b.target_offset;
}

// Few segments (most tensors): pairwise, no hashing or allocation.
void merge_small(std::vector<Segment>& segments) {
  bool changed = true;
  while (changed) {
    changed = false;
    for (size_t i = 0; i < segments.size(); ++i) {
      for (size_t j = 0; j < segments.size(); ++j) {
        if (i == j) continue;
        for (int axis = 0; axis < segments[i].shape.size(); ++axis) {
          if (!continues(segments[i], segments[j], axis)) continue;
          segments[i].shape[axis] += segments[j].shape[axis];
          collapse(segments[i]);
          segments.erase(segments.begin() + static_cast<long>(j));
          changed = true;
          break;
        }
        if (changed) break;
      }
      if (changed) break;
    }
  }
}

}  // namespace

void merge_segments(std::vector<Segment>& segments) {
  if (segments.size() <= 32) {
    merge_small(segments);
    return;
  }
  bool changed = true;
  while (changed) {
    changed = false;
    int max_ndim = 0;
    for (const auto& s : segments) max_ndim = std::max(max_ndim, s.shape.size());
    for (int axis = max_ndim - 1; axis >= 0; --axis) changed = merge_along(segments, axis) || changed;
  }
}

void sort_segments(std::vector<Segment>& segments) {
  std::sort(segments.begin(), segments.end(), [](const Segment& a, const Segment& b) {
    return std::tie(a.target_rank, a.target_offset, a.source_rank, a.source_offset, a.shape, a.source_strides,
                    a.target_strides) < std::tie(b.target_rank, b.target_offset, b.source_rank, b.source_offset,
                                                 b.shape, b.source_strides, b.target_strides);
  });
}

}  // namespace tessera::affine::detail
