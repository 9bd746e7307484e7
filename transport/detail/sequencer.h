// The Sequencer of a communicator: one thread that runs the communicator's operations strictly
// in the order they were issued (docs/DESIGN.md §7.3), whatever thread issued them. Sequence numbers
// start at 1. After the first failure the sequencer is broken: later operations fail with it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace tessera::transport {

// The shared state of one issued operation (what a Work handle waits on).
struct OpState {
  uint64_t sequence = 0;
  std::string op;
  std::chrono::milliseconds timeout{0};
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;

  void finish(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mutex);
    error = e;
    done = true;
    cv.notify_all();
  }
};

class Sequencer {
 public:
  Sequencer();
  ~Sequencer();  // runs what was issued, then joins
  Sequencer(const Sequencer&) = delete;
  Sequencer& operator=(const Sequencer&) = delete;

  // Assigns the next sequence number to `state` and queues `run`; `run` may throw.
  void issue(const std::shared_ptr<OpState>& state, std::function<void(uint64_t)> run);
  // Makes every later operation fail with `error` (the first call wins).
  void break_with(std::exception_ptr error);
  std::exception_ptr broken() const;

 private:
  void loop();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<OpState>, std::function<void(uint64_t)>>> queue_;
  uint64_t next_sequence_ = 1;
  bool stopping_ = false;
  std::exception_ptr broken_;
  std::thread thread_;
};

}  // namespace tessera::transport
