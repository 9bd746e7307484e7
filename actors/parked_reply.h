// The body of every actor's park/unpark handler (offload_states/reload_states): `move` returns the
// bytes it moved; a failure travels in the reply, as every actor's does.
#pragma once

#include <exception>
#include <string>

#include "actors/protocol.h"
#include "core/error.h"

namespace tessera::actors {

template <typename Move>
Parked parked_reply(Move&& move) {
  Parked out;
  try {
    out.bytes = move();
  } catch (...) {
    out.error = std::current_exception();
  }
  return out;
}

// Refuses `what` while this actor's buffers are in host memory.
inline void require_unparked(const zero::ParkedStorages& parked, const std::string& what) {
  if (!parked.empty())
    throw Error(what + ": the engine's states are offloaded (offload_states); call reload_states() first");
}

}  // namespace tessera::actors
