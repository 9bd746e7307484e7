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
  WaitingFinals(WaitingFinals&&) = default;
  WaitingFinals& operator=(WaitingFinals&&) = default;
  ~WaitingFinals() { fail_all(std::make_exception_ptr(Error("gradient-reducer: ended before this backward's gradients were final"))); }

  bool empty() const { return promises_.empty(); }
  void push(Promise p) { promises_.push_back(std::move(p)); }
  // Answers the oldest request.
  void deliver_front(FinalGradients out) {
    promises_.front().deliver(std::move(out));
    promises_.pop_front();
  }
  void fail_all(const std::exception_ptr& e) {
    for (auto& promise : promises_) {
      FinalGradients out;
      out.error = e;
      promise.deliver(std::move(out));
    }
    promises_.clear();
  }

 private:
  std::deque<Promise> promises_;
};

}  // namespace tessera::actors
