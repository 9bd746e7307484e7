// What tessera's own Gloo collectives (pair_all_reduce.h, exchange_all_reduce.h) share: their
// message streams' slot prefixes, kept apart here from Gloo's (0x01-0x08) and from each other, and
// the operation-wide deadline each wait on an unbound buffer gets what is left of.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace tessera::transport::gloo_ops {

constexpr uint8_t kPairContributionPrefix = 0x20;
constexpr uint8_t kPairReducedPrefix = 0x21;
constexpr uint8_t kExchangeContributionPrefix = 0x22;
constexpr uint8_t kExchangeReducedPrefix = 0x23;

using Clock = std::chrono::steady_clock;

// What is left of the operation's timeout; at least 1 ms, as Gloo reads a negative one as unset.
inline std::chrono::milliseconds left(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace tessera::transport::gloo_ops
