#include "transport/gloo/half_all_reduce.h"

#include <ATen/ATen.h>
#include <gloo/allgather.h>
#include <gloo/alltoall.h>
#include <gloo/context.h>

#include <algorithm>

namespace tessera::transport {
namespace {

// `t` grown to at least `elements` of `type` (never shrunk: one operation at a time).
at::Tensor& at_least(at::Tensor& t, int64_t elements, const at::TensorOptions& options) {
  if (!t.defined() || t.numel() < elements || t.scalar_type() != options.dtype().toScalarType())
    t = at::empty({elements}, options);
  return t;
}

// One piece: exchange, sum, all-gather.
void reduce_piece(const std::shared_ptr<gloo::Context>& context, at::Tensor& tensor, ReduceOp op, uint32_t exchange_tag,
                  uint32_t gather_tag, std::chrono::milliseconds timeout, HalfAllReduceScratch& scratch) {
  const int members = context->size, rank = context->rank;
  const int64_t n = tensor.numel(), chunk = (n + members - 1) / members, total = chunk * members;
  at::Tensor buffer = tensor;
  if (total != n) {
    buffer = at_least(scratch.padded, total, tensor.options()).narrow(0, 0, total);
    buffer.narrow(0, 0, n).copy_(tensor);
    buffer.narrow(0, n, total - n).zero_();
  }
  at::Tensor received = at_least(scratch.received, total, tensor.options()).narrow(0, 0, total);
  const auto byte_count = static_cast<size_t>(total * tensor.element_size());
  {
    gloo::AlltoallOptions o(context);
    o.setInput<uint8_t>(static_cast<uint8_t*>(buffer.data_ptr()), byte_count);
    o.setOutput<uint8_t>(static_cast<uint8_t*>(received.data_ptr()), byte_count);
    o.setTag(exchange_tag);
    o.setTimeout(timeout);
    gloo::alltoall(o);
  }
  at::Tensor sum = at_least(scratch.sum, chunk, tensor.options().dtype(at::kFloat)).narrow(0, 0, chunk);
  sum.copy_(received.narrow(0, 0, chunk));  // exact: every bf16/fp16 value is an fp32 value
  for (int r = 1; r < members; ++r) {
    const auto from = received.narrow(0, r * chunk, chunk);
    if (op == ReduceOp::max) at::maximum_out(sum, sum, from.to(at::kFloat));
    else sum.add_(from);
  }
  if (op == ReduceOp::avg) sum.div_(members);
  buffer.narrow(0, rank * chunk, chunk).copy_(sum);  // rounded once
  {
    gloo::AllgatherOptions o(context);
    o.setOutput<uint8_t>(static_cast<uint8_t*>(buffer.data_ptr()), byte_count);
    o.setTag(gather_tag);
    o.setTimeout(timeout);
    gloo::allgather(o);
  }
  if (!buffer.is_same(tensor)) tensor.copy_(buffer.narrow(0, 0, n));
}


}  // namespace

void half_all_reduce(const std::shared_ptr<gloo::Context>& context, at::Tensor& tensor, ReduceOp op, uint32_t& next_tag,
                     std::chrono::milliseconds timeout, HalfAllReduceScratch& scratch) {
  // Pieces of kHalfPieceBytes: Gloo sends each member's chunk as one message, and single messages
  // of many MiB are slow on loopback (half the speed at 128 MiB, bench_gloo).
  const int64_t piece = std::max<int64_t>(1, int64_t(kHalfPieceBytes) / tensor.element_size());
  for (int64_t begin = 0; begin < tensor.numel(); begin += piece) {
    at::Tensor part = tensor.narrow(0, begin, std::min(piece, tensor.numel() - begin));
    const uint32_t exchange_tag = next_tag++;
    reduce_piece(context, part, op, exchange_tag, next_tag++, timeout, scratch);
  }
}

}  // namespace tessera::transport
