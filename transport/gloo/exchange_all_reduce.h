// An exchange all-reduce is the all-reduce of a Gloo context of more than two members in two
// rounds of direct messages: member c owns chunk c (Gloo's ring's chunk boundaries); every member
// sends its copy of chunk c straight to member c, which sums the p copies in a fixed order and
// sends the result straight back to every member. Same bytes on the wire as the ring, the tensor's
// own dtype on it (bf16 stays 2 bytes), but 2 waits instead of the ring's 2 (p - 1) x segments per
// chunk: at 4 ranks on loopback the ring takes ~4 ms for any size up to 1 MiB (bench_gloo), as
// each of its 16 hops waits for a wake-up of the receiving process.
//
// Numerics (SumOrder):
//   ring: per element exactly what gloo::allreduce's ring computes: chunk c's copies are added
//     starting from member c - 1 downwards, ((x[c-1] + x[c-2]) + ...) + x[c] (indices mod p), at
//     the ring's chunk boundaries for this element count and size (ring_chunk_elements), so
//     results are bitwise those of the ring (collectives_test compares with c10d's
//     ProcessGroupGloo on random values).
//   member: x[0] + x[1] + ... + x[p-1] in fp32 for bf16/fp16, rounded once (after the division of
//     avg): the order reduce-scatter uses.
// max is exact in any order; avg divides the sum by p (in fp32 before rounding for bf16/fp16).
//
// Large tensors go in rounds of `piece_bytes` per chunk, so single messages stay small (loopback
// is slow for messages of many MiB). Cross-rank contract: every member calls it with the same
// element count, dtype, op, order and tag, in the same order as its other operations on the context.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "transport/communicator.h"

namespace gloo {
class Context;
}

namespace tessera::transport {

enum class SumOrder {
  ring,    // bitwise gloo::allreduce's ring
  member,  // member 0, 1, ..., as reduce-scatter
};

struct ExchangeAllReduceScratch {
  at::Tensor received;  // the tensor's dtype: one piece from each member
  at::Tensor sum;       // the compute dtype (fp32 for bf16/fp16): one piece
};

// Each member's message per round at most this (Gloo's ring sends segments of up to 1 MiB).
inline constexpr size_t kExchangePieceBytes = size_t(4) << 20;

// The elements of one chunk in gloo::allreduce's ring for `elements` elements of `element_size`
// bytes over `members` (its segments: max(ceil(bytes / 1 MiB), 2 members) rounded up to a
// multiple of members, equal and element-aligned; a chunk is members' share of them). Chunk c is
// [c * chunk, min((c + 1) * chunk, elements)), possibly empty at the end.
int64_t ring_chunk_elements(int64_t elements, int members, size_t element_size);

// `tensor`: flat, contiguous, float/bf16/fp16/double/int32/int64 (avg for floating types only).
void exchange_all_reduce(gloo::Context& context, at::Tensor& tensor, ReduceOp op, SumOrder order, uint32_t tag,
                         std::chrono::milliseconds timeout, ExchangeAllReduceScratch& scratch,
                         size_t piece_bytes = kExchangePieceBytes);

}  // namespace tessera::transport
