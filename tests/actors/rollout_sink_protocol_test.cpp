// The rollout-sink's protocol on its own (actors/rollout/sink_protocol.h, rollout_sink_actor.h),
// in one process, with work the test controls in place of a sync over UCX (the syncs themselves
// are tested between real jobs in tests/rollout):
//  - `sync` answers with the work's stats, or carries its error, and the actor serves on;
//  - `listen` receives sync after sync, records each outcome (failures too) and goes on;
//  - `stop` is answered only once the sync under way has finished, and no sync starts after it.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "actors/ask.h"
#include "actors/rollout/rollout_sink_actor.h"
// Last: the headers above bring LibTorch, whose logging defines a glog-style CHECK; Catch's must win.
#include <catch2/catch.hpp>

using namespace tessera;
using namespace tessera::actors;
using namespace std::chrono_literals;

namespace {

const std::chrono::milliseconds kTimeout{10000};

// A sync the test holds open until it releases it.
struct Gate {
  std::mutex mutex;
  std::condition_variable changed;
  bool open = true;
  int entered = 0;  // receive calls begun

  void enter() {
    std::unique_lock<std::mutex> lock(mutex);
    ++entered;
    changed.notify_all();
    changed.wait(lock, [&] { return open; });
  }
  void set_open(bool o) {
    std::lock_guard<std::mutex> lock(mutex);
    open = o;
    changed.notify_all();
  }
  bool wait_entered(int n) {
    std::unique_lock<std::mutex> lock(mutex);
    return changed.wait_for(lock, kTimeout, [&] { return entered >= n; });
  }
};

struct Recorded {
  std::mutex mutex;
  std::vector<uint64_t> versions;
  std::vector<std::string> errors;
  size_t count() {
    std::lock_guard<std::mutex> lock(mutex);
    return versions.size() + errors.size();
  }
};

SinkWork recording_work(Recorded& recorded) {
  SinkWork work;
  work.record = [&recorded](const WeightSyncStats* stats, std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(recorded.mutex);
    if (stats) recorded.versions.push_back(stats->version);
    if (error) try {
        std::rethrow_exception(error);
      } catch (const std::exception& e) {
        recorded.errors.push_back(e.what());
      }
  };
  work.failure_backoff = 1ms;
  return work;
}

void stop_actor(const rollout_sink_actor& actor) { caf::anon_send_exit(actor, caf::exit_reason::user_shutdown); }

}  // namespace

TEST_CASE("sync answers with the work's stats, carries its error, and serves on", "[actors][rollout_sink]") {
  Recorded recorded;
  auto work = recording_work(recorded);
  std::atomic<int> calls{0};
  std::atomic<bool> listening_seen{false};
  work.receive = [&](bool listening) {
    listening_seen = listening_seen || listening;
    if (++calls == 2) throw std::runtime_error("sync 2 failed verification");
    WeightSyncStats s;
    s.version = uint64_t(calls.load()) * 10;
    return s;
  };
  auto actor = spawn_rollout_sink(work);
  auto first = ask<SyncReport>(actor, kTimeout, "sink", sync_atom::value);
  CHECK_FALSE(first.error);
  CHECK(first.stats.version == 10);
  auto second = ask<SyncReport>(actor, kTimeout, "sink", sync_atom::value);
  REQUIRE(second.error);
  CHECK_THROWS_WITH(std::rethrow_exception(second.error), "sync 2 failed verification");
  auto third = ask<SyncReport>(actor, kTimeout, "sink", sync_atom::value);
  CHECK_FALSE(third.error);
  CHECK(third.stats.version == 30);
  CHECK_FALSE(listening_seen);     // `sync` is one sync, not a listening loop
  CHECK(recorded.count() == 0);    // `sync`'s outcome is its reply, not a record
  stop_actor(actor);
}

TEST_CASE("listen receives sync after sync, records successes and failures, skips stopped waits",
          "[actors][rollout_sink]") {
  Recorded recorded;
  auto work = recording_work(recorded);
  std::atomic<int> calls{0};
  work.receive = [&](bool listening) {
    if (!listening) throw std::logic_error("listen must receive as listening");
    const int n = ++calls;
    if (n == 3) throw std::runtime_error("store lost");
    WeightSyncStats s;
    s.version = n == 5 ? 0 : uint64_t(n);  // 0: a wait that ended without a sync
    return s;
  };
  auto stop = work.stop;
  auto actor = spawn_rollout_sink(work);
  caf::anon_send(actor, listen_atom::value);
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (calls.load() < 8 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
  *stop = true;
  checked(ask<Done>(actor, kTimeout, "sink", stop_atom::value));
  const int after_stop = calls.load();
  REQUIRE(after_stop >= 8);
  {
    std::lock_guard<std::mutex> lock(recorded.mutex);
    REQUIRE(recorded.errors.size() == 1);
    CHECK(recorded.errors[0] == "store lost");
    REQUIRE(recorded.versions.size() >= 5);
    CHECK(recorded.versions[0] == 1);
    CHECK(recorded.versions[1] == 2);
    CHECK(recorded.versions[2] == 4);  // 3 failed, 5 was a stopped wait: neither is a version
    CHECK(recorded.versions[3] == 6);
    for (auto v : recorded.versions) CHECK(v != 0);
  }
  std::this_thread::sleep_for(50ms);
  CHECK(calls.load() == after_stop);  // nothing receives after `stop` was answered
  stop_actor(actor);
}

TEST_CASE("stop is answered only after the sync under way has finished", "[actors][rollout_sink]") {
  Recorded recorded;
  auto work = recording_work(recorded);
  Gate gate;
  gate.set_open(false);
  std::atomic<int> calls{0};
  work.receive = [&](bool) {
    gate.enter();
    WeightSyncStats s;
    s.version = uint64_t(++calls);
    return s;
  };
  auto stop = work.stop;
  auto actor = spawn_rollout_sink(work);
  caf::anon_send(actor, listen_atom::value);
  REQUIRE(gate.wait_entered(1));  // sync 1 is under way, held by the gate
  *stop = true;
  auto answered = std::async(std::launch::async, [&] { return ask<Done>(actor, kTimeout, "sink", stop_atom::value); });
  CHECK(answered.wait_for(300ms) == std::future_status::timeout);  // not during the sync
  gate.set_open(true);
  REQUIRE(answered.wait_for(kTimeout) == std::future_status::ready);
  answered.get();
  CHECK(calls.load() == 1);             // the sync under way finished ...
  CHECK(recorded.count() == 1);         // ... and was recorded
  std::this_thread::sleep_for(50ms);
  CHECK(gate.entered == 1);             // and none began after the stop

  // The sink listens again after a stop (RolloutSink::stop clears the flag).
  *stop = false;
  caf::anon_send(actor, listen_atom::value);
  REQUIRE(gate.wait_entered(2));
  *stop = true;
  checked(ask<Done>(actor, kTimeout, "sink", stop_atom::value));
  CHECK(recorded.count() >= 2);
  stop_actor(actor);
}
