#include "core/checkpoint/background_removal.h"

#include <filesystem>

namespace tessera::checkpoint {

BackgroundRemoval::~BackgroundRemoval() { wait(); }

void BackgroundRemoval::remove(std::vector<std::string> paths) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_.valid()) running_.get();
  running_ = std::async(std::launch::async, [paths = std::move(paths)] {
    std::error_code ignored;
    for (const auto& path : paths) std::filesystem::remove_all(path, ignored);
  });
}

void BackgroundRemoval::wait() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_.valid()) running_.get();
}

}  // namespace tessera::checkpoint
