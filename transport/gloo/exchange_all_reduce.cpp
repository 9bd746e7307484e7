#include "transport/gloo/exchange_all_reduce.h"

#include <ATen/ATen.h>
#include <gloo/context.h>
#include <gloo/types.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "transport/gloo/unbound_ops.h"

namespace tessera::transport {
namespace {

// gloo::AllreduceOptions' default maximum segment.
constexpr size_t kRingSegmentBytes = size_t(1) << 20;

using gloo_ops::Clock;
using gloo_ops::left;
using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

size_t round_up(size_t value, size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// The operations of one round still in flight (one unbound buffer each, as Gloo allows one
// pending operation per buffer).
struct Pending {
  std::vector<Buffer> sends, recvs;
  void wait(Clock::time_point deadline) {
    for (auto& b : recvs) b->waitRecv(left(deadline));
    for (auto& b : sends) b->waitSend(left(deadline));
    sends.clear(), recvs.clear();
  }
};

// The order chunk `owner`'s copies are added in: the ring's starts at owner - 1 and goes down.
std::vector<int> operand_order(SumOrder order, int owner, int members) {
  std::vector<int> out(members);
  for (int j = 0; j < members; ++j) out[j] = order == SumOrder::member ? j : ((owner - 1 - j) % members + members) % members;
  return out;
}

}  // namespace

int64_t ring_chunk_elements(int64_t elements, int members, size_t element_size) {
  const size_t total = static_cast<size_t>(elements) * element_size;
  const size_t max_segment = element_size * std::max<size_t>(1, kRingSegmentBytes / element_size);
  const size_t segments =
      round_up(std::max((total + max_segment - 1) / max_segment, static_cast<size_t>(members) * 2), members);
  const size_t segment_bytes = round_up((total + segments - 1) / segments, element_size);
  return static_cast<int64_t>(segments / members * segment_bytes / element_size);
}

void exchange_all_reduce(gloo::Context& context, at::Tensor& tensor, ReduceOp op, SumOrder order, uint32_t tag,
                         std::chrono::milliseconds timeout, ExchangeAllReduceScratch& scratch, size_t piece_bytes) {
  const auto deadline = Clock::now() + timeout;
  const int members = context.size, me = context.rank;
  const auto dtype = tensor.scalar_type();
  const auto compute = is_half(dtype) ? at::kFloat : dtype;
  const int64_t n = tensor.numel(), element = tensor.element_size();
  // bf16/fp16 chunk as the ring would chunk their fp32 upcast (their member order is the same
  // at any boundaries).
  const int64_t chunk = ring_chunk_elements(n, members, at::elementSize(compute));
  const int64_t piece = std::min(chunk, std::max<int64_t>(1, static_cast<int64_t>(piece_bytes) / element));
  const int64_t rounds = (chunk + piece - 1) / piece;
  auto chunk_length = [&](int c) { return std::max<int64_t>(0, std::min(n, (c + 1) * chunk) - c * chunk); };
  // Round k's part of chunk c: [c * chunk + k * piece, + length).
  auto part_length = [&](int c, int64_t k) { return std::clamp<int64_t>(chunk_length(c) - k * piece, 0, piece); };
  auto part_offset = [&](int c, int64_t k) { return c * chunk + k * piece; };

  if (!scratch.received.defined() || scratch.received.scalar_type() != dtype ||
      scratch.received.numel() < members * piece)
    scratch.received = at::empty({members * piece}, tensor.options());
  if (!scratch.sum.defined() || scratch.sum.scalar_type() != compute || scratch.sum.numel() < piece)
    scratch.sum = at::empty({piece}, tensor.options().dtype(compute));
  auto* base = static_cast<uint8_t*>(tensor.data_ptr());
  auto* received = static_cast<uint8_t*>(scratch.received.data_ptr());
  auto over = [&](uint8_t* at, int64_t length) { return context.createUnboundBuffer(at, length * element); };
  const auto contribution = gloo::Slot::build(gloo_ops::kExchangeContributionPrefix, tag);
  const auto reduced = gloo::Slot::build(gloo_ops::kExchangeReducedPrefix, tag);
  const std::vector<int> operands = operand_order(order, me, members);

  // Copies of this member's part to their owners; the other members' copies of this member's part.
  auto post_exchange = [&](int64_t k, Pending& p) {
    const int64_t mine = part_length(me, k);
    for (int m = 0; m < members; ++m) {
      if (m == me) continue;
      if (mine > 0) (p.recvs.emplace_back(over(received + m * piece * element, mine)))->recv(m, contribution);
      if (const int64_t theirs = part_length(m, k); theirs > 0)
        (p.sends.emplace_back(over(base + part_offset(m, k) * element, theirs)))->send(m, contribution);
    }
  };
  // This member's reduced part to every member; theirs into the tensor where they belong.
  auto post_gather = [&](int64_t k, Pending& p) {
    const int64_t mine = part_length(me, k);
    for (int m = 0; m < members; ++m) {
      if (m == me) continue;
      if (mine > 0) (p.sends.emplace_back(over(base + part_offset(me, k) * element, mine)))->send(m, reduced);
      if (const int64_t theirs = part_length(m, k); theirs > 0)
        (p.recvs.emplace_back(over(base + part_offset(m, k) * element, theirs)))->recv(m, reduced);
    }
  };
  auto reduce_part = [&](int64_t k) {
    const int64_t length = part_length(me, k);
    if (length == 0) return;
    at::Tensor own = tensor.narrow(0, part_offset(me, k), length);
    auto copy_of = [&](int m) { return m == me ? own : scratch.received.narrow(0, m * piece, length); };
    at::Tensor acc = scratch.sum.narrow(0, 0, length);
    acc.copy_(copy_of(operands[0]));
    for (int j = 1; j < members; ++j) {
      if (op == ReduceOp::max) at::maximum_out(acc, acc, copy_of(operands[j]).to(compute));
      else acc.add_(copy_of(operands[j]));
    }
    if (op == ReduceOp::avg) acc.div_(members);
    own.copy_(acc);  // rounded once for bf16/fp16
  };

  // Round k's all-gather runs while round k + 1's exchange is on the wire (they touch different parts).
  Pending gather;
  for (int64_t k = 0; k < rounds; ++k) {
    Pending exchange;
    post_exchange(k, exchange);
    exchange.wait(deadline);
    reduce_part(k);
    gather.wait(deadline);
    post_gather(k, gather);
  }
  gather.wait(deadline);
}

}  // namespace tessera::transport
