#include "actors/rollout/rollout_sink_actor.h"

#include <thread>

#include "actors/actor_runtime.h"

namespace tessera::actors {
namespace {

rollout_sink_actor::behavior_type rollout_sink(rollout_sink_actor::pointer self, std::shared_ptr<SinkWork> work) {
  return {
      [work](sync_atom) -> SyncReport {
        SyncReport report;
        try {
          report.stats = work->receive(false);
        } catch (...) {
          report.error = std::current_exception();
        }
        return report;
      },
      // One sync per message; the next `listen` goes to the back of the mailbox, so a `stop` sent
      // meanwhile is answered between two syncs, never during one.
      [self, work](listen_atom) {
        if (work->stop->load()) return;
        try {
          const auto stats = work->receive(true);
          if (stats.version != 0) work->record(&stats, nullptr);
        } catch (...) {
          work->record(nullptr, std::current_exception());
          std::this_thread::sleep_for(work->failure_backoff);
        }
        if (!work->stop->load()) self->send(self, listen_atom::value);
      },
      [](stop_atom) -> Done { return {}; },
  };
}

}  // namespace

rollout_sink_actor spawn_rollout_sink(SinkWork work) {
  return actor_system().spawn<caf::detached>(rollout_sink, std::make_shared<SinkWork>(std::move(work)));
}

}  // namespace tessera::actors
