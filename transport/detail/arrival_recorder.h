// The ArrivalRecorder of a communicator records in the store which operation this rank is waiting
// in — but only once the operation has been running for a while (min(1 s, timeout / 4)), so fast
// collectives cost no store round trip and no thread switch (one watchdog thread per process
// checks every recorder each kScanPeriod). When an operation times out, every rank that did arrive
// has been waiting in it long enough to be recorded; the ranks without a record at that sequence
// number are the ones that never arrived (or arrived in the last quarter of the timeout).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

namespace tessera::transport {

class Store;

class ArrivalRecorder {
 public:
  // Records under "<store prefix>arrived/<rank>".
  ArrivalRecorder(std::shared_ptr<Store> store, int rank);
  ~ArrivalRecorder();
  ArrivalRecorder(const ArrivalRecorder&) = delete;
  ArrivalRecorder& operator=(const ArrivalRecorder&) = delete;

  // The sequencer entered / left operation `sequence` (whose timeout is `timeout`).
  void begin(uint64_t sequence, std::chrono::milliseconds timeout);
  void end();

  // Called by the watchdog: writes the operation's record once it has run past its delay.
  void record_if_due();

  static constexpr std::chrono::milliseconds kMaxDelay{1000};
  static constexpr std::chrono::milliseconds kScanPeriod{50};

 private:
  std::shared_ptr<Store> store_;
  std::string key_;
  std::mutex mutex_;
  uint64_t current_ = 0;   // 0: none running
  uint64_t recorded_ = 0;  // last sequence written to the store
  std::chrono::steady_clock::time_point due_;
};

}  // namespace tessera::transport
