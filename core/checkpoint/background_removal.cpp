#include "core/checkpoint/background_removal.h"

#include <filesystem>

namespace tessera::checkpoint {

BackgroundRemoval::~BackgroundRemoval() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return queue_.empty() && current_.empty(); });
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void BackgroundRemoval::remove(std::vector<std::string> paths) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& p : paths) queue_.push_back(std::move(p));
  if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  changed_.notify_all();
}

void BackgroundRemoval::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return queue_.empty() && current_.empty(); });
}

std::set<std::string> BackgroundRemoval::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::set<std::string> out(queue_.begin(), queue_.end());
  if (!current_.empty()) out.insert(current_);
  return out;
}

void BackgroundRemoval::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    current_ = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::error_code ignored;
    std::filesystem::remove_all(current_, ignored);
    lock.lock();
    current_.clear();
    changed_.notify_all();
  }
}

}  // namespace tessera::checkpoint
