// WaitingFinals: the optimizer-shard's requests for the next final sub-group, oldest first
// (tessera.offload.optimizer_during_backward). A request is never left unanswered: a failed
// reduction, a new backward or the reducer's end answers every waiting one with an error.
#pragma once

#include <deque>
#include <exception>
#include <utility>

#include <caf/typed_response_promise.hpp>

#include "actors/protocol.h"
#include "core/error.h"

namespace tessera::actors {

class WaitingFinals {
 public:
  using Promise = caf::typed_response_promise<FinalGradients>;

  WaitingFinals() = default;
  // Moves leave the source empty, and an assignment answers what the target held: no request is
  // dropped unanswered (the actor's state is move-assigned at its start).
  WaitingFinals(WaitingFinals&& other) noexcept : promises_(std::exchange(other.promises_, {})) {}
  WaitingFinals& operator=(WaitingFinals&& other) {
    if (this != &other) {
      fail_all(ended());
      promises_ = std::exchange(other.promises_, {});
    }
    return *this;
  }
  ~WaitingFinals() { fail_all(ended()); }

  bool empty() const { return promises_.empty(); }
  void push(Promise p) { promises_.push_back(std::move(p)); }
  // Answers the oldest request.
  void deliver_front(FinalGradients out) {
    promises_.front().deliver(std::move(out));
    promises_.pop_front();
  }
  void fail_all(const std::exception_ptr& e) {
    if (promises_.empty()) return;
    for (auto& promise : promises_) {
      FinalGradients out;
      out.error = e;
      promise.deliver(std::move(out));
    }
    promises_.clear();
  }

 private:
  static std::exception_ptr ended() {
    return std::make_exception_ptr(Error("gradient-reducer: ended before this backward's gradients were final"));
  }
  std::deque<Promise> promises_;
};

}  // namespace tessera::actors
