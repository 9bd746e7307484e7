// One save's work after the ranks agreed on it (engine_checkpoint_save.cpp prepares it on the
// user's thread): write this rank's file, exchange the entries, rank 0 writes the manifest and
// commits, every rank learns the verdict. Run inline over the engine's control communicator (a
// synchronous save) or by the checkpoint writer over its own (an asynchronous one).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "actors/engine/engine.h"
#include "core/checkpoint/background_removal.h"
#include "core/checkpoint/manifest.h"
#include "core/checkpoint/save_layout.h"

namespace tessera {
namespace transport {
class Communicator;
}

struct SaveJob {
  std::string dir, tag, partial;  // the root, the tag, the agreed partial directory
  int rank = 0, world = 1;
  std::vector<checkpoint::EngineMap> maps;
  checkpoint::RankAliases aliases;
  // This rank's written ranges, by buffer key: views of the engine's buffers (synchronous) or
  // the writer's staging copies (asynchronous).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  checkpoint::Manifest manifest;  // everything but files and maps (rank 0 completes it)
  bool save_latest = true;
  int64_t keep_last = 0;
  std::function<void(SavePoint)> at_point_for_testing;
  // Rank 0: removes a replaced tag off the committing thread (nullptr: at once).
  std::shared_ptr<checkpoint::BackgroundRemoval> removal;
  // Why this rank has nothing to write (an asynchronous snapshot that failed): it takes part in
  // the exchange with this error, so that every rank fails the save alike.
  std::string failed_before_writing;
};

// Returns the committed tag directory; CheckpointError (the same on every rank) otherwise, with
// the partial directory removed.
std::string run_save_job(const SaveJob& job, transport::Communicator* comm);

}  // namespace tessera
