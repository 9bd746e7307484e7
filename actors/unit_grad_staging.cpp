#include "actors/unit_grad_staging.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"

namespace tessera::actors {
namespace {

constexpr int64_t kAlign = 64;  // bytes: the piece view in a slot starts on a cache line
int64_t aligned(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

UnitGradStaging::UnitGradStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters, int slots,
                                 int64_t chunk_elements)
    : spec_(std::move(spec)), parameters_(std::move(parameters)), ring_(slots) {
  const auto& plan = *spec_->plan;
  const int64_t world = plan.world();
  const int64_t run = std::max<int64_t>(1, chunk_elements / world);  // per rank, per chunk
  item_of_.assign(parameters_.size(), -1);
  auto add = [&](std::vector<int64_t> segments) {
    int64_t n = 0;
    std::vector<Chunk> chunks;
    for (int64_t s : segments) {
      const auto& seg = plan.segments()[size_t(s)];
      for (int64_t p : seg.params) item_of_[size_t(p)] = int64_t(items_.size()), ++n;
      const int64_t element = int64_t(c10::elementSize(spec_->comm_dtype(seg.group)));
      for (int64_t begin = 0; begin < seg.layout.partition_numel; begin += run) {
        const int64_t length = std::min(run, seg.layout.partition_numel - begin);
        chunks.push_back({s, begin, length});
        slot_bytes_ = std::max(slot_bytes_, aligned(world * length * element) + length * element);
      }
    }
    size_.push_back(n);
    items_.push_back(std::move(segments));
    chunks_.push_back(std::move(chunks));
  };
  for (size_t u = plan.units().size(); u-- > 0;) add(plan.units()[u].segments);
  for (size_t s = 0; s < plan.segments().size(); ++s)
    if (plan.segments()[s].persistent()) add({int64_t(s)});
  for (int k = 0; k < slots; ++k)
    slots_.push_back(at::empty({std::max<int64_t>(slot_bytes_, 1)}, at::TensorOptions().dtype(at::kByte).device(spec_->device)));
  ready_.assign(parameters_.size(), 0);
  missing_.assign(items_.size(), 0);
}

void UnitGradStaging::start() {
  std::fill(ready_.begin(), ready_.end(), 0);
  missing_ = size_;
  next_ = 0;
  active_ = true;
}

void UnitGradStaging::take(int64_t param) {
  if (!active_ || param < 0 || size_t(param) >= ready_.size() || ready_[size_t(param)]) return;
  ready_[size_t(param)] = 1;
  const int64_t item = item_of_[size_t(param)];
  if (item >= 0) --missing_[size_t(item)];
  issue_ready();
}

void UnitGradStaging::issue_ready() {
  while (next_ < items_.size() && missing_[next_] == 0) stage(next_++);
}

void UnitGradStaging::take_rest() {
  if (!active_) return;
  while (next_ < items_.size()) stage(next_++);
  active_ = false;
}

int UnitGradStaging::acquire_slot() {
  int slot = -1;
  while (!ring_.try_take(slot)) {
    caf::anon_send(reducer_, reclaim_atom::value);  // finish the oldest reduction now
    ring_.wait_for_free(spec_->timeout, "ZeRO-3 gradient staging: item " + std::to_string(next_) + " of " +
                                            std::to_string(items_.size()) +
                                            " waits: no staging slot came back from the gradient-reducer");
  }
  return slot;
}

void UnitGradStaging::give_back(int slot) { ring_.give_back(slot); }

void UnitGradStaging::stage(size_t item) {
  for (const auto& chunk : chunks_[item]) stage_chunk(chunk);
  const auto& plan = *spec_->plan;
  for (int64_t index : items_[item])
    for (int64_t p : plan.segments()[size_t(index)].params) parameters_[size_t(p)].mutable_grad() = at::Tensor();
}

void UnitGradStaging::stage_chunk(const Chunk& chunk) {
  const auto& s = spec_->plan->segments()[size_t(chunk.segment)];
  const auto dtype = spec_->comm_dtype(s.group);
  const int64_t element = int64_t(c10::elementSize(dtype)), world = s.layout.dp_size;
  StagedChunk out;
  out.segment = chunk.segment, out.begin = chunk.begin, out.length = chunk.length;
  out.slot = acquire_slot();
  const auto& bytes = slots_[size_t(out.slot)];
  out.data = bytes.narrow(0, 0, world * chunk.length * element).view(dtype);
  out.piece = bytes.narrow(0, aligned(world * chunk.length * element), chunk.length * element).view(dtype);
  // Rank r's run: gathered-segment elements [lo, hi) into data[r * length, ...). The parameters lie
  // in offset order; what no parameter covers (alignment gaps, padding) is zero.
  const auto& slots = s.layout.params;
  for (int64_t r = 0; r < world; ++r) {
    const int64_t lo = r * s.layout.partition_numel + chunk.begin, hi = lo + chunk.length;
    auto run = out.data.narrow(0, r * chunk.length, chunk.length);
    int64_t cursor = lo;
    auto first = std::lower_bound(slots.begin(), slots.end(), lo,
                                  [](const zero::ParameterSlot& p, int64_t at) { return p.offset + p.numel <= at; });
    for (auto it = first; it != slots.end() && it->offset < hi; ++it) {
      const int64_t from = std::max(lo, it->offset), to = std::min(hi, it->offset + it->numel);
      if (from >= to) continue;
      if (from > cursor) run.narrow(0, cursor - lo, from - cursor).zero_();
      const auto& grad = parameters_[size_t(s.params[size_t(it - slots.begin())])].grad();
      auto target = run.narrow(0, from - lo, to - from);
      if (grad.defined()) target.copy_(grad.reshape(-1).narrow(0, from - it->offset, to - from));
      else target.zero_();
      cursor = to;
    }
    if (cursor < hi) run.narrow(0, cursor - lo, hi - cursor).zero_();
  }
  caf::anon_send(reducer_, chunk_atom::value, std::move(out));
}

}  // namespace tessera::actors
