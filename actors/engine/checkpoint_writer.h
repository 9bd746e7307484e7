// The checkpoint writer: one thread that runs asynchronous saves (run_save_job) one at a time,
// while training goes on, and keeps the host staging area they are snapshotted into (allocated at
// the first asynchronous save, reused by the next ones while the buffers keep their sizes).
// Owned by Engine::Impl; the user's thread submits, waits and reads the result; the writer's
// thread runs the job and is then the only user of the engine's control communicator.
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace tessera {

class CheckpointWriter {
 public:
  CheckpointWriter();
  ~CheckpointWriter();  // waits for the job in flight (its error is logged, not raised)
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // A copy of `source` in the staging area under `key` (the same tensor again when the shape and
  // dtype are unchanged). Only while no job is in flight.
  at::Tensor stage(const std::string& key, const at::Tensor& source);
  int64_t staging_bytes() const;

  // Runs `job` on the writer's thread. At most one in flight: call wait() first.
  void submit(std::function<void()> job);
  // Waits for the job in flight; raises its error once.
  void wait();
  bool busy() const;

 private:
  void loop();
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> job_;
  bool running_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::map<std::string, at::Tensor> staging_;
  std::thread thread_;
};

}  // namespace tessera
