// Seconds since a steady-clock time point: the actors' step timings (StepReport) and the benches.
#pragma once

#include <chrono>

namespace tessera {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace tessera
