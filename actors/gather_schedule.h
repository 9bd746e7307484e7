// GatherSchedule decides ZeRO-3's gathers ahead of demand and its releases, from the fetches alone:
// no tensors, no messages, no communicator (the stage-3 parameter-shard asks it and does the
// gathering; tests/actors/gather_schedule_test.cpp runs it without processes).
//
// Record: the fetches of the first window (a training engine's: from the first fetch to the first
// update; a ZeRO inference engine's: its first Engine::forward) are the record. Later windows
// follow it; a fetch that is not the record's next leaves it for the rest of the window.
// Ahead: while following, after a fetch the next recorded units that are not gathered are gathered
// ahead: the next one whatever its size, more while the elements ahead stay within
// stage3_prefetch_bucket_size, and everything gathered within stage3_max_live_parameters.
// Reuse: while following, a unit whose next use in the record comes before
// stage3_max_reuse_distance elements of other units' gathers stays gathered after a use.
// Everything depends only on the record and the order of the fetches, which the program fixes, so
// every rank decides alike.
//
// Example: units of 10, 20, 30 elements, record 0 1 2 2 1 0 (a forward, then its backward), bucket
// 25: after the next window's fetch of 0, unit 1 is gathered ahead (20); unit 2 would pass 25.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace tessera::actors {

struct GatherLimits {
  int64_t prefetch_elements = 0;   // stage3_prefetch_bucket_size (0: nothing ahead)
  int64_t max_live_elements = 0;   // stage3_max_live_parameters
  int64_t max_reuse_elements = 0;  // stage3_max_reuse_distance (0: release after every use)
};

class GatherSchedule {
 public:
  // `unit_elements[u]`: unit u's gathered elements. `forward_windows`: ZeRO inference (each
  // Engine::forward is a window; fetches outside one are on demand and outside the order).
  GatherSchedule(std::vector<int64_t> unit_elements, GatherLimits limits, bool forward_windows);

  enum class Step {
    unordered,  // a scope's fetch, or one outside a forward window: not part of the order
    recorded,   // appended to the record (the first window)
    followed,   // the record's next fetch
    left,       // not the record's next: this window stops following (diverged() says where)
    on_demand,  // in order, but the window already left the record
  };
  Step fetch(int64_t unit, bool ordered);
  // After a Step::left: the position in the record and the unit recorded there (-1: its end).
  size_t left_at() const { return left_at_; }
  int64_t recorded_at_left() const { return recorded_at_left_; }

  // Units to gather ahead now, in order: `gathered(u)` says whether unit u is gathered or on its
  // way, `ahead_elements` how many elements are on their way ahead already, `live_elements` how
  // many are gathered in all.
  std::vector<int64_t> ahead(const std::function<bool(int64_t)>& gathered, int64_t ahead_elements,
                             int64_t live_elements) const;
  // Whether `unit`, just used, should stay gathered: the record uses it again soon.
  bool reused_soon(int64_t unit) const;

  void begin_window();  // ZeRO inference: an Engine::forward begins
  void end_window();    // ... and ends
  void end_update();    // training: an update's gather ends a window

  bool recording() const { return recording_; }
  bool following() const { return following_; }
  int64_t windows() const { return windows_; }
  const std::vector<int64_t>& record() const { return trace_; }

 private:
  void close_window();

  std::vector<int64_t> elements_;
  GatherLimits limits_;
  bool forward_windows_;
  std::vector<int64_t> trace_;
  bool recording_ = true, following_ = false, in_window_ = false;
  size_t position_ = 0;
  int64_t windows_ = 0;
  size_t left_at_ = 0;
  int64_t recorded_at_left_ = -1;
};

}  // namespace tessera::actors
