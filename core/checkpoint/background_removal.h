// BackgroundRemoval deletes directories and files on a thread of its own: a replaced checkpoint tag
// or export is already out of sight (renamed to a hidden name), and freeing its blocks (ext4
// mounted with `discard` trims them) took a quarter of a 256 MiB save's time on the caller's
// thread. remove() queues and returns at once; the queue is worked in order. A save or export that
// clears leftovers skips what is queued (pending()) instead of waiting for it. wait() waits for the
// queue to empty; the destructor waits too. Thread-safe (the asynchronous checkpoint writer and the
// user's thread both schedule). Errors are ignored: what is left is hidden, and the next save or
// export removes leftovers.
#pragma once

#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tessera::checkpoint {

class BackgroundRemoval {
 public:
  BackgroundRemoval() = default;
  ~BackgroundRemoval();
  BackgroundRemoval(const BackgroundRemoval&) = delete;
  BackgroundRemoval& operator=(const BackgroundRemoval&) = delete;

  void remove(std::vector<std::string> paths);  // each removed recursively, in order
  void wait();
  // The paths queued or being removed (as given to remove()).
  std::set<std::string> pending() const;

 private:
  void loop();
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::string> queue_;
  std::string current_;  // being removed ("" when idle)
  bool stopping_ = false;
  std::thread thread_;  // started by the first remove()
};

}  // namespace tessera::checkpoint
