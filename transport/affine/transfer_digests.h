// What the processes of a remote transfer compare before any byte moves (remote_executor.h, step
// 2): an FNV-1a digest of the whole batch, made of one digest per transfer (its plan, the plan's
// inputs and both placements). When the batch digests differ, every process publishes its
// per-transfer digests ("<hex digest> <tensor>" lines, in batch order) and the refusal names the
// first tensor planned differently.
//
// Example: one process planned q_proj from source maps whose two row halves were swapped: its
// transfer 1 digest differs from the others', and the refusal ends "tensor
// 'model.layers.0.self_attn.q_proj.weight' is planned differently (transfer 1 of 35: ...)".
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera::transport {

// FNV-1a over bytes, integers and length-prefixed strings.
struct Fnv {
  uint64_t h = 1469598103934665603ull;
  void bytes(const void* p, size_t n) {
    auto* c = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 1099511628211ull;
  }
  void u64(uint64_t v) { bytes(&v, sizeof v); }
  void str(const std::string& s) {
    u64(s.size());
    bytes(s.data(), s.size());
  }
};

using TransferDigests = std::vector<std::pair<std::string, uint64_t>>;  // (tensor, digest) in batch order

std::string encode_transfer_digests(const TransferDigests& digests);
TransferDigests decode_transfer_digests(const std::string& text);
// The first transfer whose tensor or digest differs between two processes' lists, in words.
std::string first_differing_transfer(const TransferDigests& a, const TransferDigests& b);

}  // namespace tessera::transport
