#include "core/affine/detail/box_index.h"

#include <algorithm>
#include <numeric>

namespace tessera::affine::detail {

BoxIndex::BoxIndex(std::vector<Box> boxes) : boxes_(std::move(boxes)) {
  if (boxes_.empty()) return;
  const int ndim = boxes_.front().ndim();
  if (ndim == 0) return;
  // Sweep axis: most distinct begins among nonempty boxes (ties: lowest axis).
  size_t best = 0;
  std::vector<int64_t> values;
  values.reserve(boxes_.size());
  for (int k = 0; k < ndim; ++k) {
    values.clear();
    for (const auto& b : boxes_) {
      if (!b.is_empty()) values.push_back(b.origin[k]);
    }
    std::sort(values.begin(), values.end());
    const size_t distinct = static_cast<size_t>(std::unique(values.begin(), values.end()) - values.begin());
    if (axis_ < 0 || distinct > best) {
      axis_ = k;
      best = distinct;
    }
  }
  order_.resize(boxes_.size());
  std::iota(order_.begin(), order_.end(), size_t{0});
  const int axis = axis_;
  std::sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
    if (boxes_[a].origin[axis] != boxes_[b].origin[axis]) return boxes_[a].origin[axis] < boxes_[b].origin[axis];
    return a < b;
  });
  begins_.resize(order_.size());
  running_max_end_.resize(order_.size());
  int64_t running = INT64_MIN;
  for (size_t j = 0; j < order_.size(); ++j) {
    const Box& b = boxes_[order_[j]];
    begins_[j] = b.origin[axis];
    if (!b.is_empty()) running = std::max(running, b.end(axis));
    running_max_end_[j] = running;
  }
}

size_t BoxIndex::upper_bound_begin(int64_t value) const {
  return static_cast<size_t>(std::upper_bound(begins_.begin(), begins_.end(), value) - begins_.begin());
}

int64_t BoxIndex::covered_volume(const Box& q) const {
  int64_t covered = 0;
  for_each_overlap(q, [&](size_t, const Box& overlap) { covered += overlap.volume(); });
  return covered;
}

}  // namespace tessera::affine::detail
