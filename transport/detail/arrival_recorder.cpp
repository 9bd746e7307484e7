#include "transport/detail/arrival_recorder.h"

#include <algorithm>

#include "core/error.h"
#include "transport/store.h"

namespace tessera::transport {

ArrivalRecorder::ArrivalRecorder(std::shared_ptr<Store> store, int rank)
    : store_(std::move(store)), key_("arrived/" + std::to_string(rank)), thread_([this] { loop(); }) {}

ArrivalRecorder::~ArrivalRecorder() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ArrivalRecorder::begin(uint64_t sequence, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = sequence;
  due_ = std::chrono::steady_clock::now() + std::min(kMaxDelay, timeout / 4);
  cv_.notify_all();
}

void ArrivalRecorder::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = 0;
  cv_.notify_all();
}

void ArrivalRecorder::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (current_ == 0 || current_ == recorded_) {
      cv_.wait(lock);
      continue;
    }
    const uint64_t waiting_in = current_;
    if (cv_.wait_until(lock, due_, [&] { return stopping_ || current_ != waiting_in; })) continue;
    recorded_ = waiting_in;
    lock.unlock();
    try {
      store_->set(key_, std::to_string(waiting_in));
    } catch (const Error&) {
      // The store is gone (rank 0 died?): the operation itself will report that.
    }
    lock.lock();
  }
}

}  // namespace tessera::transport
