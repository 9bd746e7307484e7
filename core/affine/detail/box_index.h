// BoxIndex answers "which of these boxes intersect box q" without testing every box: boxes are sorted
// by their begin on one sweep axis (the axis with the most distinct begins), with a running maximum
// of their ends, so a query visits only boxes whose sweep interval can reach q.
//
// Cost: O(n log n) to build; a query costs O(log n + boxes visited). For tilings (row splits, column
// splits, ZeRO runs) the sweep axis separates the boxes and a query visits O(answer) boxes.
// Empty boxes are never reported. A 0-d box intersects every other 0-d box.
#pragma once

#include <cstdint>
#include <vector>

#include "core/affine/box.h"

namespace tessera::affine::detail {

class BoxIndex {
 public:
  BoxIndex() = default;
  explicit BoxIndex(std::vector<Box> boxes);

  size_t size() const { return boxes_.size(); }
  const Box& box(size_t i) const { return boxes_[i]; }

  // Calls visit(i, intersection) for every box i that intersects q (in decreasing sweep order).
  template <class Visit>
  void for_each_overlap(const Box& q, Visit&& visit) const {
    if (q.is_empty() || boxes_.empty()) return;
    if (axis_ < 0) {
      for (size_t i = 0; i < boxes_.size(); ++i) {
        if (!boxes_[i].is_empty()) visit(i, q);
      }
      return;
    }
    const int64_t q_begin = q.origin[axis_];
    const int64_t q_end = q_begin + q.shape[axis_];
    size_t hi = upper_bound_begin(q_end - 1);  // sorted positions with begin <= q_end - 1
    while (hi > 0) {
      --hi;
      if (running_max_end_[hi] <= q_begin) break;
      const size_t i = order_[hi];
      const Box& b = boxes_[i];
      if (b.intersects(q)) visit(i, intersect(b, q));
    }
  }

  // Sum of volumes of the intersections of q with the indexed boxes (exact when they are disjoint).
  int64_t covered_volume(const Box& q) const;

 private:
  size_t upper_bound_begin(int64_t value) const;

  std::vector<Box> boxes_;
  int axis_ = -1;
  std::vector<size_t> order_;           // positions sorted by begin on axis_
  std::vector<int64_t> begins_;         // begin of order_[j]
  std::vector<int64_t> running_max_end_;  // max end over order_[0..j]
};

}  // namespace tessera::affine::detail
