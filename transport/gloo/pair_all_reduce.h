// A pair all-reduce is the all-reduce of a two-member Gloo context as one pipelined exchange:
// member 0 reduces the first half of the elements (ceil(n / 2)), member 1 the second; each
// member sends its tensor's copy of the other half in segments of kSegmentBytes, reduces each
// segment of its own half as it arrives and sends it straight back, so the reduce-scatter and the
// all-gather overlap and the wire carries the tensor's own dtype (bf16 stays 2 bytes an element).
//
// Numerics: every element is combined exactly once, owner's value op peer's value, in the
// backend's compute type (fp32 for bf16/fp16, which are rounded back once, after the division of
// avg), so both members get the same bits, and the same bits as Gloo's ring or bcube at two ranks
// (one commutative addition, then the division by 2) — the ZeRO oracles' digests do not move.
//
// Why not gloo::allreduce: its bcube sends each half as one message, which on loopback runs 4-6x
// slower than the ring from ~64 MiB on (bench_gloo), and its ring finishes the reduce-scatter before
// the all-gather starts and carries bf16 as fp32 (Gloo has no bf16).
//
// Cross-rank contract: both members call it with the same element count, dtype, op and tag, in the
// same order as their other operations on the context. The caller owns `scratch` (grown here,
// never shrunk; one operation at a time).
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

struct PairAllReduceScratch {
  at::Tensor received;  // the peer's copy of this member's half, the tensor's dtype
  at::Tensor upcast;    // two fp32 segments, for bf16/fp16
};

// 1 MiB as Gloo's ring uses: one segment in flight per direction at a time is enough to keep the
// socket busy, and single messages of 16 MiB or more are what makes bcube slow (bench_gloo).
inline constexpr size_t kPairSegmentBytes = size_t(1) << 20;

// `tensor`: flat, contiguous, float/bf16/fp16/double/int32/int64 (avg for floating types only).
void pair_all_reduce(gloo::Context& context, at::Tensor& tensor, ReduceOp op, uint32_t tag,
                     std::chrono::milliseconds timeout, PairAllReduceScratch& scratch,
                     size_t segment_bytes = kPairSegmentBytes);

}  // namespace tessera::transport
