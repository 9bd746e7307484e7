#include "transport/detail/arrival_recorder.h"

#include <algorithm>
#include <condition_variable>
#include <set>
#include <thread>

#include "core/error.h"
#include "transport/store.h"

namespace tessera::transport {
namespace {

// One thread per process scans every recorder a few times a second; begin() and end() only take a
// mutex, so a fast collective costs no thread switch (docs/DESIGN.md §5.1: a bucket's reduction is on the
// hot path of every backward).
class Watchdog {
 public:
  static Watchdog& get() {
    static Watchdog* w = new Watchdog();  // never destroyed: recorders may outlive static destruction
    return *w;
  }
  void add(ArrivalRecorder* r) {
    std::lock_guard<std::mutex> lock(mutex_);
    recorders_.insert(r);
  }
  void remove(ArrivalRecorder* r) {
    std::unique_lock<std::mutex> lock(mutex_);
    recorders_.erase(r);
    // A scan may be using `r` right now: wait until it is done.
    idle_.wait(lock, [&] { return !scanning_; });
  }

 private:
  Watchdog() {
    std::thread([this] { loop(); }).detach();
  }
  void loop() {
    for (;;) {
      std::this_thread::sleep_for(ArrivalRecorder::kScanPeriod);
      std::unique_lock<std::mutex> lock(mutex_);
      scanning_ = true;
      const auto snapshot = recorders_;
      lock.unlock();
      for (auto* r : snapshot) r->record_if_due();
      lock.lock();
      scanning_ = false;
      idle_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable idle_;
  std::set<ArrivalRecorder*> recorders_;
  bool scanning_ = false;
};

}  // namespace

ArrivalRecorder::ArrivalRecorder(std::shared_ptr<Store> store, int rank)
    : store_(std::move(store)), key_("arrived/" + std::to_string(rank)) {
  Watchdog::get().add(this);
}

ArrivalRecorder::~ArrivalRecorder() { Watchdog::get().remove(this); }

void ArrivalRecorder::begin(uint64_t sequence, std::chrono::milliseconds timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = sequence;
  due_ = std::chrono::steady_clock::now() + std::min(kMaxDelay, timeout / 4);
}

void ArrivalRecorder::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  current_ = 0;
}

void ArrivalRecorder::record_if_due() {
  uint64_t waiting_in = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (current_ == 0 || current_ == recorded_ || std::chrono::steady_clock::now() < due_) return;
    waiting_in = recorded_ = current_;
  }
  try {
    store_->set(key_, std::to_string(waiting_in));
  } catch (const Error&) {
    // The store is gone (rank 0 died?): the operation itself will report that.
  }
}

}  // namespace tessera::transport
