#include "transport/gloo/pair_all_reduce.h"

#include <ATen/ATen.h>
#include <gloo/context.h>
#include <gloo/math.h>
#include <gloo/types.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "transport/gloo/unbound_ops.h"

namespace tessera::transport {
namespace {

using gloo_ops::Clock;
using gloo_ops::left;
// Segments of contribution in flight per direction: two, as Gloo's ring, so that one is on the
// wire while the other is reduced.
constexpr int64_t kWindow = 2;

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

bool is_half(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// Segment k of the half [begin, end): elements [begin + k * segment, min(end, ...)).
struct Half {
  int64_t begin, end, segment;
  int64_t count() const { return end > begin ? (end - begin + segment - 1) / segment : 0; }
  int64_t offset(int64_t k) const { return begin + k * segment; }
  int64_t length(int64_t k) const { return std::min(end, offset(k) + segment) - offset(k); }
};

// owner := owner op peer in T, then / 2 for avg: per element what Gloo's ring computes at two
// ranks followed by the backend's div_(2).
template <typename T>
void combine(at::Tensor& owner, const at::Tensor& peer, ReduceOp op) {
  auto* out = owner.data_ptr<T>();
  if (op == ReduceOp::max)
    gloo::max<T>(out, out, peer.data_ptr<T>(), owner.numel());
  else
    gloo::sum<T>(out, out, peer.data_ptr<T>(), owner.numel());
  if (op == ReduceOp::avg) owner.div_(2);
}

void combine_segment(at::Tensor owner, const at::Tensor& peer, ReduceOp op, at::Tensor& upcast) {
  switch (owner.scalar_type()) {
    case at::kFloat: return combine<float>(owner, peer, op);
    case at::kDouble: return combine<double>(owner, peer, op);
    case at::kLong: return combine<int64_t>(owner, peer, op);
    case at::kInt: return combine<int32_t>(owner, peer, op);
    default: break;  // bf16/fp16: in fp32, rounded once
  }
  const int64_t n = owner.numel();
  at::Tensor a = upcast.narrow(0, 0, n), b = upcast.narrow(0, n, n);
  a.copy_(owner);
  b.copy_(peer);
  combine<float>(a, b, op);
  owner.copy_(a);
}

void wait_recv(const Buffer& b, Clock::time_point deadline) { b->waitRecv(left(deadline)); }
void wait_send(const Buffer& b, Clock::time_point deadline) { b->waitSend(left(deadline)); }

}  // namespace

void pair_all_reduce(gloo::Context& context, at::Tensor& tensor, ReduceOp op, uint32_t tag,
                     std::chrono::milliseconds timeout, PairAllReduceScratch& scratch, size_t segment_bytes) {
  const auto deadline = Clock::now() + timeout;
  const int rank = context.rank, peer = 1 - context.rank;
  const int64_t n = tensor.numel(), element = tensor.element_size(), first = (n + 1) / 2;
  const int64_t segment = std::max<int64_t>(1, static_cast<int64_t>(segment_bytes) / element);
  const Half mine = rank == 0 ? Half{0, first, segment} : Half{first, n, segment};
  const Half theirs = rank == 0 ? Half{first, n, segment} : Half{0, first, segment};
  const int64_t slots = std::min(kWindow, std::max<int64_t>(mine.count(), 1));
  if (!scratch.received.defined() || scratch.received.scalar_type() != tensor.scalar_type() ||
      scratch.received.numel() < slots * segment)
    scratch.received = at::empty({slots * segment}, tensor.options());
  if (is_half(tensor.scalar_type()) && (!scratch.upcast.defined() || scratch.upcast.numel() < 2 * segment))
    scratch.upcast = at::empty({2 * segment}, tensor.options().dtype(at::kFloat));
  const auto contribution = gloo::Slot::build(gloo_ops::kPairContributionPrefix, tag);
  const auto reduced = gloo::Slot::build(gloo_ops::kPairReducedPrefix, tag);

  // One unbound buffer per pending operation (Gloo allows one at a time on each).
  auto* base = static_cast<uint8_t*>(tensor.data_ptr());
  auto* slot_base = static_cast<uint8_t*>(scratch.received.data_ptr());
  auto over = [&](const Half& h, int64_t k) {
    return context.createUnboundBuffer(base + h.offset(k) * element, h.length(k) * element);
  };
  std::vector<Buffer> slot(slots), sent(theirs.count()), reduced_in(theirs.count()), reduced_out(mine.count());
  for (int64_t s = 0; s < slots; ++s)
    slot[s] = context.createUnboundBuffer(slot_base + s * segment * element, segment * element);
  auto post_contribution = [&](int64_t k) {
    if (k < mine.count()) slot[k % slots]->recv(peer, contribution, 0, mine.length(k) * element);
    if (k < theirs.count()) (sent[k] = over(theirs, k))->send(peer, contribution);
  };
  for (int64_t k = 0; k < kWindow; ++k) post_contribution(k);
  for (int64_t k = 0; k < std::max(mine.count(), theirs.count()); ++k) {
    if (k < mine.count()) {
      wait_recv(slot[k % slots], deadline);
      combine_segment(tensor.narrow(0, mine.offset(k), mine.length(k)),
                      scratch.received.narrow(0, (k % slots) * segment, mine.length(k)), op, scratch.upcast);
      (reduced_out[k] = over(mine, k))->send(peer, reduced);
    }
    // The peer's reduced segment k lands where contribution k was sent from: only once it left.
    if (k < theirs.count()) {
      wait_send(sent[k], deadline);
      (reduced_in[k] = over(theirs, k))->recv(peer, reduced);
    }
    post_contribution(k + kWindow);
  }
  for (auto& b : reduced_in) wait_recv(b, deadline);
  for (auto& b : reduced_out) wait_send(b, deadline);
}

}  // namespace tessera::transport
