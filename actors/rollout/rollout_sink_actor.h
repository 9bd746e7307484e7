// The rollout-sink actor (its messages: sink_protocol.h) apart from the work of a sync, so that
// its protocol is testable on its own (tests/actors/rollout_sink_protocol_test.cpp): RolloutSink
// (rollout_sink.cpp) gives it the sync over UCX; a test gives it work it controls.
#pragma once

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>

#include "actors/rollout/sink_protocol.h"

namespace tessera::actors {

struct SinkWork {
  // One sync; `listening`: receiving in a loop, so a wait for the training job also ends when
  // `stop` is set (stats.version 0: stopped before a sync began, nothing to record).
  std::function<WeightSyncStats(bool listening)> receive;
  // A listened sync's outcome: its stats, or the error it raised.
  std::function<void(const WeightSyncStats* stats, std::exception_ptr error)> record;
  // Set by the owner before it sends `stop`: listening ends after the sync under way.
  std::shared_ptr<std::atomic<bool>> stop = std::make_shared<std::atomic<bool>>(false);
  // After a failed listened sync: a lost store fails at once, so the loop must not spin.
  std::chrono::milliseconds failure_backoff{100};
};

// A detached actor (a sync blocks its thread for as long as the sync takes).
rollout_sink_actor spawn_rollout_sink(SinkWork work);

}  // namespace tessera::actors
