#include "actors/unit_grad_staging.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace tessera::actors {

UnitGradStaging::UnitGradStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters)
    : spec_(std::move(spec)), parameters_(std::move(parameters)) {
  const auto& plan = *spec_->plan;
  item_of_.assign(parameters_.size(), -1);
  auto add = [&](std::vector<int64_t> segments) {
    int64_t n = 0;
    for (int64_t s : segments)
      for (int64_t p : plan.segments()[size_t(s)].params) item_of_[size_t(p)] = int64_t(items_.size()), ++n;
    size_.push_back(n);
    items_.push_back(std::move(segments));
  };
  for (size_t u = plan.units().size(); u-- > 0;) add(plan.units()[u].segments);
  for (size_t s = 0; s < plan.segments().size(); ++s)
    if (plan.segments()[s].persistent()) add({int64_t(s)});
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

void UnitGradStaging::stage(size_t item) {
  const auto& plan = *spec_->plan;
  StagedSegments out;
  out.item = int64_t(item);
  for (int64_t index : items_[item]) {
    const auto& s = plan.segments()[size_t(index)];
    auto data = at::empty({s.layout.padded_numel}, at::TensorOptions().dtype(spec_->comm_dtype(s.group)).device(spec_->device));
    int64_t end = 0;
    for (size_t k = 0; k < s.params.size(); ++k) {
      const auto& slot = s.layout.params[k];
      auto& p = parameters_[size_t(s.params[k])];
      auto target = data.narrow(0, slot.offset, slot.numel);
      const auto& grad = p.grad();
      if (grad.defined()) target.copy_(grad.reshape(-1));
      else target.zero_();
      p.mutable_grad() = at::Tensor();
      end = slot.offset + slot.numel;
    }
    if (end < s.layout.padded_numel) data.narrow(0, end, s.layout.padded_numel - end).zero_();
    out.segments.emplace_back(index, std::move(data));
  }
  caf::anon_send(reducer_, segments_atom::value, std::move(out));
}

}  // namespace tessera::actors
