#include "actors/engine/checkpoint_writer.h"

#include <ATen/ATen.h>
#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>

#include "actors/actor_runtime.h"
#include "core/elapsed.h"
#include "core/error.h"
#include "core/io/huge_page_buffer.h"
#include "core/log/log.h"

namespace tessera {

// Where the save in flight is; the user's thread waits on it, the actor moves it on.
struct CheckpointWriter::Progress {
  enum class Phase : uint8_t { idle, snapshotting, writing };
  std::mutex mutex;
  std::condition_variable changed;
  Phase phase = Phase::idle;
  std::exception_ptr error;
  std::atomic<int64_t> staging_bytes{0};

  void reach(Phase next, std::exception_ptr failure = nullptr) {
    std::lock_guard<std::mutex> lock(mutex);
    phase = next;
    if (failure) error = failure;
    changed.notify_all();
  }
};

namespace {

using save_atom = caf::atom_constant<caf::atom("ckptsave")>;

struct AsyncSave {
  std::shared_ptr<SaveJob> job;
  std::shared_ptr<std::vector<SnapshotSource>> sources;
  std::shared_ptr<const std::vector<WatchedTensor>> watched;
  std::shared_ptr<CheckpointWriter::Progress> progress;
};

}  // namespace
}  // namespace tessera

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::AsyncSave)

namespace tessera {
namespace {

using checkpoint_writer_actor = caf::typed_actor<caf::reacts_to<save_atom, AsyncSave>>;

struct WriterState {
  std::shared_ptr<transport::Communicator> comm;
  std::map<std::string, at::Tensor> staging;  // by buffer key, reused while sizes and dtypes hold

  // A copy of `source` in the staging slot `key`. A contiguous CPU source is copied with memcpy:
  // glibc's large copies bypass the cache (non-temporal stores), about twice as fast as a tensor
  // copy_ of hundreds of MiB here.
  at::Tensor stage(const std::string& key, const at::Tensor& source) {
    auto& slot = staging[key];
    if (!slot.defined() || slot.numel() != source.numel() || slot.scalar_type() != source.scalar_type())
      slot = io::huge_page_empty(source.numel(), source.scalar_type());  // the first save's faults, 2 MiB each
    if (source.device().is_cpu() && source.is_contiguous())
      std::memcpy(slot.data_ptr(), source.data_ptr(), source.nbytes());
    else
      slot.copy_(source.reshape({source.numel()}));
    return slot;
  }

  int64_t bytes() const {
    int64_t n = 0;
    for (const auto& [key, t] : staging) n += int64_t(t.nbytes());
    return n;
  }
};

// The snapshot: every source into its staging slot, then the check that nothing watched changed
// meanwhile.
void snapshot(WriterState& state, std::vector<SnapshotSource>& sources, const std::vector<WatchedTensor>& watched,
              SaveJob& job) {
  for (const auto& s : sources) job.tensors.push_back({s.key, state.stage(s.key, s.view)});
  for (const auto& w : watched)
    if (w.counter.current_version() != w.at_save)
      throw CheckpointError("save_checkpoint " + (job.dir + "/" + job.tag) + ": " + w.name +
                            " was changed in place while the asynchronous save copied it; until step() (or "
                            "wait_for_checkpoint()) change the weights only through the engine");
}

checkpoint_writer_actor::behavior_type writer(checkpoint_writer_actor::stateful_pointer<WriterState> self,
                                              std::shared_ptr<transport::Communicator> comm) {
  self->state.comm = std::move(comm);
  return {
      [=](save_atom, const AsyncSave& save) {
        using Phase = CheckpointWriter::Progress::Phase;
        auto& job = *save.job;
        try {
          if (job.at_point_for_testing) job.at_point_for_testing(SavePoint::snapshot_begins);
          snapshot(self->state, *save.sources, *save.watched, job);
        } catch (const std::exception& e) {
          job.failed_before_writing = e.what();  // every rank learns it in the save's exchange
        }
        save.sources->clear();  // the engine's buffers are not held past the snapshot
        save.progress->staging_bytes = self->state.bytes();
        save.progress->reach(Phase::writing);
        std::exception_ptr error;
        try {
          run_save_job(job, self->state.comm.get());
        } catch (...) {
          error = std::current_exception();
        }
        job.tensors.clear();
        save.progress->reach(Phase::idle, error);
      },
  };
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::shared_ptr<transport::Communicator> comm)
    : progress_(std::make_shared<Progress>()),
      actor_(std::make_unique<caf::actor>(
          caf::actor_cast<caf::actor>(actors::actor_system().spawn<caf::detached>(writer, std::move(comm))))) {}

CheckpointWriter::~CheckpointWriter() {
  try {
    wait();
  } catch (const std::exception& e) {
    log::warn(std::string("checkpoint writer: the last asynchronous save failed: ") + e.what());
  }
  // The actor's state (staging, communicator) goes before the engine's other parts: wait for it.
  caf::scoped_actor self{actors::actor_system()};
  self->monitor(*actor_);
  self->send_exit(*actor_, caf::exit_reason::user_shutdown);
  bool ended = false;
  self->receive([&](const caf::down_msg&) { ended = true; }, caf::after(std::chrono::seconds(20)) >> [] {});
  if (!ended) log::warn("checkpoint writer: the actor did not end within 20 s of the engine's destruction");
}

WatchedTensor WatchedTensor::of(std::string name, const at::Tensor& t) {
  WatchedTensor w{std::move(name), t.unsafeGetTensorImpl()->version_counter()};
  if (w.counter.enabled()) w.at_save = w.counter.current_version();
  return w;
}

void CheckpointWriter::submit(SaveJob job, std::vector<SnapshotSource> sources, std::vector<WatchedTensor> watched) {
  watched.erase(std::remove_if(watched.begin(), watched.end(), [](const WatchedTensor& w) { return !w.counter.enabled(); }),
                watched.end());  // inference tensors track no versions
  {
    std::lock_guard<std::mutex> lock(progress_->mutex);
    if (progress_->phase != Progress::Phase::idle) throw Error("checkpoint writer: a save is already in flight");
    progress_->phase = Progress::Phase::snapshotting;
  }
  AsyncSave save{std::make_shared<SaveJob>(std::move(job)),
                 std::make_shared<std::vector<SnapshotSource>>(std::move(sources)),
                 std::make_shared<const std::vector<WatchedTensor>>(std::move(watched)), progress_};
  caf::anon_send(*actor_, save_atom::value, std::move(save));
}

double CheckpointWriter::wait_for_snapshot() {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(progress_->mutex);
  if (progress_->phase != Progress::Phase::snapshotting) return 0;
  progress_->changed.wait(lock, [this] { return progress_->phase != Progress::Phase::snapshotting; });
  return seconds_since(t0);
}

void CheckpointWriter::wait() {
  std::unique_lock<std::mutex> lock(progress_->mutex);
  progress_->changed.wait(lock, [this] { return progress_->phase == Progress::Phase::idle; });
  if (progress_->error) std::rethrow_exception(std::exchange(progress_->error, nullptr));
}

int64_t CheckpointWriter::staging_bytes() const { return progress_->staging_bytes; }

}  // namespace tessera
