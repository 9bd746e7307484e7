// SlotRing is the free list of a fixed ring of staging slots: the thread that fills slots takes
// them, the gradient-reducer (another thread) gives each back once its reduction finished. Only
// the list is shared (under its mutex); a slot's bytes belong to whoever holds it. Used by
// BucketStaging (stage 2) and UnitGradStaging (stage 3).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "core/error.h"

namespace tessera::actors {

class SlotRing {
 public:
  explicit SlotRing(int slots) {
    for (int s = 0; s < slots; ++s) free_.push_back(s);
  }

  // A free slot into `slot`, or false.
  bool try_take(int& slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (free_.empty()) return false;
    slot = free_.back();
    free_.pop_back();
    return true;
  }

  // Waits until a slot is free; TimeoutError(`what` + the bound) after `timeout`.
  void wait_for_free(std::chrono::milliseconds timeout, const std::string& what) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!returned_.wait_for(lock, timeout, [&] { return !free_.empty(); }))
      throw TimeoutError(what + " within " + std::to_string(timeout.count()) + " ms");
  }

  void give_back(int slot) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.push_back(slot);
    }
    returned_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable returned_;
  std::vector<int> free_;
};

}  // namespace tessera::actors
