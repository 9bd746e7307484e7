// The checkpoint writer: a detached CAF actor (its own thread) that runs asynchronous saves one
// at a time while training goes on, with its own communicator (the user's thread keeps the
// engine's control communicator, e.g. for the SIGTERM agreement at every step).
//
// A save reaches it as views of this rank's stored buffers (SnapshotSource). It first copies them
// into its host staging area (allocated at the first save, reused while the buffers keep their
// sizes), then writes and commits (run_save_job). The engine waits for the snapshot, not the
// write, before anything that changes stored state (step(), an update during backward, a
// write-back, offload_states): the copy overlaps the next forward and backward, which only read
// the buffers. A buffer changed in place anyway (its version counter moved, e.g. a user's
// `p.mul_()` under no_grad) fails the save on every rank, naming the buffer.
//
// Owned by Engine::Impl; the user's thread submits, waits and reads the result.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/TensorImpl.h>
#include <caf/fwd.hpp>

#include <memory>
#include <string>
#include <vector>

#include "actors/engine/checkpoint_save_job.h"

namespace tessera {
namespace transport {
class Communicator;
}

// A buffer an asynchronous save snapshots: a view of the engine's own.
struct SnapshotSource {
  std::string key;
  at::Tensor view;
};

// A tensor whose change in place before the snapshot ends fails the save: the buffers, and the
// module's parameters aliasing them (each has its own counter). Its version counter is held, not
// the tensor: the writer's thread must not own a tensor Python may own.
struct WatchedTensor {
  std::string name;  // "buffer 'param/0'", "parameter 'fc1.weight'"
  c10::VariableVersion counter;
  uint32_t at_save = 0;
  static WatchedTensor of(std::string name, const at::Tensor& t);
};

class CheckpointWriter {
 public:
  // `comm` (nullptr on one rank) is the writer's alone from here on.
  explicit CheckpointWriter(std::shared_ptr<transport::Communicator> comm);
  ~CheckpointWriter();  // waits for the save in flight (its error is logged, not raised), ends the actor
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Sends `job` and the buffers to snapshot into it (job.tensors gets the staging copies, after
  // the ones it holds). At most one save in flight: call wait() first.
  void submit(SaveJob job, std::vector<SnapshotSource> sources, std::vector<WatchedTensor> watched);
  // Until this returns, the sources of the save in flight must not change. Its wait, in seconds.
  double wait_for_snapshot();
  // Waits for the save in flight; raises its error once.
  void wait();
  int64_t staging_bytes() const;

  struct Progress;  // shared with the actor (checkpoint_writer.cpp)

 private:
  std::shared_ptr<Progress> progress_;
  std::unique_ptr<caf::actor> actor_;
};

}  // namespace tessera
