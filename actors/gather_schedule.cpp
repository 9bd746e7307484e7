#include "actors/gather_schedule.h"

#include <algorithm>

namespace tessera::actors {

GatherSchedule::GatherSchedule(std::vector<int64_t> unit_elements, GatherLimits limits, bool forward_windows)
    : elements_(std::move(unit_elements)), limits_(limits), forward_windows_(forward_windows) {}

GatherSchedule::Step GatherSchedule::fetch(int64_t unit, bool ordered) {
  if (!ordered || (forward_windows_ && !in_window_)) return Step::unordered;
  if (recording_) {
    trace_.push_back(unit);
    return Step::recorded;
  }
  if (!following_) return Step::on_demand;
  if (position_ < trace_.size() && trace_[position_] == unit) {
    ++position_;
    return Step::followed;
  }
  following_ = false;
  left_at_ = position_;
  recorded_at_left_ = position_ < trace_.size() ? trace_[position_] : -1;
  return Step::left;
}

std::vector<int64_t> GatherSchedule::ahead(const std::function<bool(int64_t)>& gathered, int64_t ahead_elements,
                                           int64_t live_elements) const {
  std::vector<int64_t> out;
  if (!following_ || limits_.prefetch_elements <= 0) return out;
  for (size_t k = position_; k < trace_.size(); ++k) {
    const int64_t u = trace_[k];
    // Gathered, or listed already (the record uses it twice ahead).
    if (gathered(u) || std::find(out.begin(), out.end(), u) != out.end()) continue;
    const int64_t n = elements_[size_t(u)];
    // At least one unit ahead whatever its size (as DeepSpeed), then within the bucket.
    if ((ahead_elements > 0 && ahead_elements + n > limits_.prefetch_elements) ||
        live_elements + n > limits_.max_live_elements)
      break;
    out.push_back(u);
    ahead_elements += n, live_elements += n;
  }
  return out;
}

bool GatherSchedule::reused_soon(int64_t unit) const {
  if (!following_ || limits_.max_reuse_elements <= 0) return false;
  int64_t traversed = 0;
  for (size_t k = position_; k < trace_.size() && traversed < limits_.max_reuse_elements; ++k) {
    if (trace_[k] == unit) return true;
    traversed += elements_[size_t(trace_[k])];
  }
  return false;
}

void GatherSchedule::begin_window() {
  in_window_ = true;
  position_ = 0;
  following_ = !recording_;
}

void GatherSchedule::end_window() {
  in_window_ = false;
  close_window();
  following_ = false;
}

void GatherSchedule::end_update() {
  close_window();
  following_ = !recording_;  // (also without prefetch: reuse follows the record too)
  position_ = 0;
}

void GatherSchedule::close_window() {
  ++windows_;
  if (recording_ && !trace_.empty()) recording_ = false;
}

}  // namespace tessera::actors
