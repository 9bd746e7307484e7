// A half all-reduce is the all-reduce of a bf16/fp16 tensor over more than two Gloo members with
// the tensor's own dtype on the wire: an exchange (gloo::alltoall) hands member r its chunk r of
// every member's tensor, member r sums those chunks in fp32 in member order (c_0 + c_1 + ...,
// divided there for avg) and rounds once into its chunk, and an in-place all-gather hands every
// member every chunk. Gloo's ring instead carries the fp32 upcast (Gloo has no bf16): twice the
// bytes, and two conversion passes over the whole tensor (bench_gloo at 4 ranks: 0.82-0.86 of c10d's
// fp32 all-reduce of the same element count).
//
// Numerics: every member gets the same bits; the operands are added in member order, as
// reduce-scatter adds them (Gloo's ring adds each chunk starting at another member; fp32 sums of
// a few bf16 values rarely round, so results match the ring's almost always, not always).
//
// The tensor is reduced in pieces of kHalfPieceBytes, each cut in chunks of ceil(piece / members)
// elements; when that does not divide the piece it is staged in the caller's scratch (padded; pad
// elements are reduced and dropped). Cross-rank contract: every member calls it with the same
// element count, dtype, op and next tag, in the same order as its other operations on the context.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/communicator.h"

namespace gloo {
class Context;
}

namespace tessera::transport {

struct HalfAllReduceScratch {
  at::Tensor padded;    // the tensor's dtype, members x chunk (only when the chunks do not divide it)
  at::Tensor received;  // the tensor's dtype, members x chunk: chunk `rank` of every member
  at::Tensor sum;       // fp32, one chunk
};

// Pieces of the tensor reduced one after the other (each member's message at most this / members).
inline constexpr size_t kHalfPieceBytes = size_t(4) << 20;

// `tensor`: flat, contiguous bf16 or fp16; op sum, avg or max. Takes two tags a piece from `next_tag`.
void half_all_reduce(const std::shared_ptr<gloo::Context>& context, at::Tensor& tensor, ReduceOp op, uint32_t& next_tag,
                     std::chrono::milliseconds timeout, HalfAllReduceScratch& scratch);

}  // namespace tessera::transport
