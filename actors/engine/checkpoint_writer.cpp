#include "actors/engine/checkpoint_writer.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/io/huge_page_buffer.h"
#include "core/log/log.h"

namespace tessera {

CheckpointWriter::CheckpointWriter() : thread_([this] { loop(); }) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::warn(std::string("checkpoint writer: the last asynchronous save failed: ") + e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

at::Tensor CheckpointWriter::stage(const std::string& key, const at::Tensor& source) {
  if (busy()) throw Error("checkpoint writer: staging while a save is in flight");
  auto& slot = staging_[key];
  if (!slot.defined() || slot.numel() != source.numel() || slot.scalar_type() != source.scalar_type())
    slot = io::huge_page_empty(source.numel(), source.scalar_type());  // the first save's faults, 2 MiB each
  slot.copy_(source.reshape({source.numel()}));
  return slot;
}

int64_t CheckpointWriter::staging_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t bytes = 0;
  for (const auto& [key, t] : staging_) bytes += int64_t(t.nbytes());
  return bytes;
}

void CheckpointWriter::submit(std::function<void()> job) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (running_) throw Error("checkpoint writer: a save is already in flight");
  job_ = std::move(job);
  running_ = true;
  changed_.notify_all();
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return !running_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

bool CheckpointWriter::busy() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return running_;
}

void CheckpointWriter::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stopping_ || (running_ && job_); });
    if (stopping_ && !running_) return;
    auto job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    running_ = false;
    changed_.notify_all();
  }
}

}  // namespace tessera
