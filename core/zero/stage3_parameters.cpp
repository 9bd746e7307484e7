#include "core/zero/stage3_parameters.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "core/error.h"

namespace tessera::zero {

Stage3Parameters::Stage3Parameters(const ShardingPlan& plan, int rank, const std::vector<at::Tensor>& parameters,
                                   at::ScalarType dtype, const Fill& fill, WeightHome home)
    : plan_(&plan), rank_(rank), home_(home) {
  if (plan.stage() != 3) throw Error("Stage3Parameters: the sharding plan is for stage " + std::to_string(plan.stage()));
  if (parameters.size() != plan.parameters().size())
    throw Error("Stage3Parameters: " + std::to_string(parameters.size()) + " parameters for a plan of " +
                std::to_string(plan.parameters().size()));
  if (rank < 0 || rank >= plan.world())
    throw Error("Stage3Parameters: rank " + std::to_string(rank) + " outside [0, " + std::to_string(plan.world()) + ")");
  options_ = at::TensorOptions().dtype(dtype).device(parameters.empty() ? c10::Device(c10::kCPU) : parameters.front().device());
  c10::AutoGradMode no_grad(false);
  auto weight_options = options_;
  if (home != WeightHome::with_units)  // pinned memory exists only beside a GPU
    weight_options = options_.device(c10::kCPU).pinned_memory(home == WeightHome::host_pinned && options_.device().is_cuda());
  for (size_t g = 0; g < plan.groups().size(); ++g)
    weights_.push_back(at::zeros({plan.weight_buffer_elements(int64_t(g))}, weight_options));
  const auto& segments = plan.segments();
  // Values of a segment's parameters into `gathered` (its padded_numel), then the parameters rebound to views of it.
  auto place = [&](const Stage3Segment& s, const at::Tensor& gathered) {
    for (size_t k = 0; k < s.params.size(); ++k) {
      const auto& p = parameters[size_t(s.params[k])];
      const auto& slot = s.layout.params[k];
      auto view = gathered.narrow(0, slot.offset, slot.numel).view(p.sizes());
      if (!fill || !fill(s.params[k], view)) view.copy_(p.detach());
      auto param = p;  // a handle on the same TensorImpl
      param.set_data(view);
    }
  };
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    auto persistent = persistent_segment(int64_t(g));
    if (!persistent.defined()) continue;
    for (int64_t index : plan.groups()[g].segments) {
      const auto& s = segments[size_t(index)];
      if (!s.persistent()) continue;
      place(s, persistent);
      piece(index).copy_(persistent.narrow(0, s.layout.partition_begin(rank), s.layout.partition_numel));
    }
  }
  for (size_t u = 0; u < plan.units().size(); ++u) {
    const auto& unit = plan.units()[u];
    auto gathered = at::zeros({unit.gathered_numel}, options_);
    for (int64_t index : unit.segments) {
      const auto& s = segments[size_t(index)];
      auto region = gathered.narrow(0, s.gathered_offset, s.layout.padded_numel);
      place(s, region);
      piece(index).copy_(region.narrow(0, s.layout.partition_begin(rank), s.layout.partition_numel));
    }
    UnitStorage storage;
    storage.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(gathered.storage().unsafeGetStorageImpl());
    storage.nbytes = int64_t(storage.storage->nbytes());
    storage.live = true;
    units_.push_back(std::move(storage));
    release(int64_t(u));
  }
}

Stage3Parameters::~Stage3Parameters() = default;

at::Tensor Stage3Parameters::partition(int64_t group) const {
  return weights_.at(size_t(group)).narrow(0, 0, plan_->groups().at(size_t(group)).layout.partition_numel);
}

at::Tensor Stage3Parameters::piece(int64_t segment) const {
  const auto& s = plan_->segments().at(size_t(segment));
  return weights_.at(size_t(s.group)).narrow(0, s.partition_offset, s.layout.partition_numel);
}

at::Tensor Stage3Parameters::persistent_segment(int64_t group) const {
  for (int64_t index : plan_->groups().at(size_t(group)).segments) {
    const auto& s = plan_->segments()[size_t(index)];
    if (s.persistent()) return weights_[size_t(group)].narrow(0, s.gathered_offset, s.layout.padded_numel);
  }
  return {};
}

at::Tensor Stage3Parameters::materialize(int64_t unit) {
  auto& u = units_.at(size_t(unit));
  if (!u.live) {
    auto* allocator = u.storage->allocator();
    if (!allocator) throw Error("ZeRO-3: unit '" + plan_->units()[size_t(unit)].module + "' has no allocator");
    u.storage->set_data_ptr_noswap(allocator->allocate(size_t(u.nbytes)));
    u.storage->set_nbytes(size_t(u.nbytes));
    u.live = true;
  }
  return alias(unit);
}

at::Tensor Stage3Parameters::alias(int64_t unit) const {
  const auto& u = units_.at(size_t(unit));
  if (!u.live) return {};
  // A tensor of its own on the same storage: writes through it bump no parameter's version counter.
  return at::empty({0}, options_).set_(c10::Storage(u.storage), 0, {plan_->units()[size_t(unit)].gathered_numel}, {1});
}

void Stage3Parameters::release(int64_t unit) {
  auto& u = units_.at(size_t(unit));
  if (!u.live) return;
  u.storage->set_data_ptr_noswap(c10::DataPtr(nullptr, options_.device()));
  u.storage->set_nbytes(0);
  u.live = false;
}

void Stage3Parameters::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(int64_t(u));
}

int64_t Stage3Parameters::gathered_bytes() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.live ? u.nbytes : 0;
  return n;
}

}  // namespace tessera::zero
