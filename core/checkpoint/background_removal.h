// BackgroundRemoval deletes directories and files on a thread of its own: a replaced checkpoint tag
// or export is already out of sight (renamed to a hidden name), and freeing its blocks took a
// quarter of a 256 MiB save's time on the caller's thread. One removal runs at a time: remove()
// waits for the one before, wait() for the last; the destructor waits too. Thread-safe (the
// asynchronous checkpoint writer and the user's thread both schedule). Errors are ignored: what
// is left is hidden, and the next save or export removes leftovers.
#pragma once

#include <future>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::checkpoint {

class BackgroundRemoval {
 public:
  BackgroundRemoval() = default;
  ~BackgroundRemoval();
  BackgroundRemoval(const BackgroundRemoval&) = delete;
  BackgroundRemoval& operator=(const BackgroundRemoval&) = delete;

  void remove(std::vector<std::string> paths);  // each removed recursively
  void wait();

 private:
  std::mutex mutex_;
  std::future<void> running_;
};

}  // namespace tessera::checkpoint
