// ask(): a blocking request to an actor, from any thread that is not that actor's: waits at most
// `timeout` for the reply of type R. An actor that does not answer (gone, or too slow) is a
// tessera::Error naming `what`; an error inside the reply is the caller's to rethrow.
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <string>
#include <utility>

#include "actors/actor_runtime.h"
#include "core/error.h"

namespace tessera::actors {

template <class R, class Handle, class... Ts>
R ask(const Handle& dest, std::chrono::milliseconds timeout, const std::string& what, Ts&&... args) {
  caf::scoped_actor self{actor_system()};
  R out{};
  std::string failure;
  bool answered = false;
  self->request(dest, timeout, std::forward<Ts>(args)...)
      .receive([&](R& reply) { out = std::move(reply), answered = true; },
               [&](caf::error& e) { failure = actor_system().render(e); });
  if (!answered) throw Error(what + ": no answer within " + std::to_string(timeout.count()) + " ms (" + failure + ")");
  return out;
}

// Rethrows the error a reply carries.
template <class R>
R checked(R reply) {
  if (reply.error) std::rethrow_exception(reply.error);
  return reply;
}

}  // namespace tessera::actors
