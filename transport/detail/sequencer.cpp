#include "transport/detail/sequencer.h"

namespace tessera::transport {

Sequencer::Sequencer() : thread_([this] { loop(); }) {}

Sequencer::~Sequencer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Sequencer::issue(const std::shared_ptr<OpState>& state, std::function<void(uint64_t)> run) {
  std::lock_guard<std::mutex> lock(mutex_);
  state->sequence = next_sequence_++;
  queue_.emplace_back(state, std::move(run));
  cv_.notify_all();
}

void Sequencer::break_with(std::exception_ptr error) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_) broken_ = error;
}

std::exception_ptr Sequencer::broken() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_;
}

void Sequencer::loop() {
  for (;;) {
    std::shared_ptr<OpState> state;
    std::function<void(uint64_t)> run;
    std::exception_ptr broken;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      state = std::move(queue_.front().first);
      run = std::move(queue_.front().second);
      queue_.pop_front();
      broken = broken_;
    }
    if (broken) {
      state->finish(broken);
      continue;
    }
    try {
      run(state->sequence);
      state->finish(nullptr);
    } catch (...) {
      break_with(std::current_exception());
      state->finish(std::current_exception());
    }
  }
}

}  // namespace tessera::transport
