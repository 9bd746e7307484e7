#include "core/zero/stage3_parameters.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <xxhash.h>

#include "core/error.h"

namespace tessera::zero {

Stage3Parameters::Stage3Parameters(const ShardingPlan& plan, int rank, const std::vector<at::Tensor>& parameters,
                                   at::ScalarType dtype, const Fill& fill, WeightHome home,
                                   std::optional<ParameterSwapOptions> swap)
    : plan_(&plan), rank_(rank), home_(home) {
  if ((home == WeightHome::nvme) != swap.has_value())
    throw Error("Stage3Parameters: a swap file's options are given exactly with WeightHome::nvme");
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
  std::vector<ParameterSwap::Partition> swapped;
  for (size_t g = 0; g < plan.groups().size(); ++g) {
    const int64_t whole = plan.weight_buffer_elements(int64_t(g)), partition = plan.groups()[g].layout.partition_numel;
    weights_.push_back(at::zeros({swap ? whole - partition : whole}, weight_options));
    swapped.push_back({dtype, partition});
  }
  if (swap) {
    swap_ = std::make_shared<ParameterSwap>(std::move(swapped), *swap);
    lent_.resize(plan.groups().size());
    lent_hashes_.resize(plan.groups().size());
  }
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
      write_piece(index, persistent.narrow(0, s.layout.partition_begin(rank), s.layout.partition_numel));
    }
  }
  for (size_t u = 0; u < plan.units().size(); ++u) {
    const auto& unit = plan.units()[u];
    auto gathered = at::zeros({unit.gathered_numel}, options_);
    for (int64_t index : unit.segments) {
      const auto& s = segments[size_t(index)];
      auto region = gathered.narrow(0, s.gathered_offset, s.layout.padded_numel);
      place(s, region);
      write_piece(index, region.narrow(0, s.layout.partition_begin(rank), s.layout.partition_numel));
    }
    UnitStorage storage;
    storage.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(gathered.storage().unsafeGetStorageImpl());
    storage.nbytes = int64_t(storage.storage->nbytes());
    storage.live = true;
    units_.push_back(std::move(storage));
    release(int64_t(u));
  }
  if (swap_) swap_->flush();  // a write that failed is an error of the construction
}

Stage3Parameters::~Stage3Parameters() = default;

at::Tensor Stage3Parameters::weight_buffer(int64_t group) {
  return swap_ ? lend(group) : weights_.at(size_t(group));
}

at::Tensor Stage3Parameters::partition(int64_t group) {
  return weight_buffer(group).narrow(0, 0, plan_->groups().at(size_t(group)).layout.partition_numel);
}

at::Tensor Stage3Parameters::piece(int64_t segment) const {
  if (swap_) throw Error("Stage3Parameters: the partitions are in a swap file; a piece is read or written, not viewed");
  const auto& s = plan_->segments().at(size_t(segment));
  return weights_.at(size_t(s.group)).narrow(0, s.partition_offset, s.layout.partition_numel);
}

void Stage3Parameters::read_piece(int64_t segment, const at::Tensor& dst) {
  if (!swap_) {
    dst.copy_(piece(segment));
    return;
  }
  settle_lent();
  const auto& s = plan_->segments().at(size_t(segment));
  const auto dtype = options_.dtype().toScalarType();
  if (dst.device().is_cpu() && dst.is_contiguous() && dst.dim() == 1 && dst.scalar_type() == dtype) {
    swap_->read(s.group, s.partition_offset, dst);
    return;
  }
  auto host = at::empty({s.layout.partition_numel}, at::dtype(dtype));
  swap_->read(s.group, s.partition_offset, host);
  dst.copy_(host.view(dst.sizes()));
}

void Stage3Parameters::write_piece(int64_t segment, const at::Tensor& src) {
  if (!swap_) {
    piece(segment).copy_(src);
    return;
  }
  settle_lent();
  const auto& s = plan_->segments().at(size_t(segment));
  if (src.numel() != s.layout.partition_numel)
    throw Error("Stage3Parameters: a piece of segment " + std::to_string(segment) + " has " +
                std::to_string(s.layout.partition_numel) + " elements, not " + std::to_string(src.numel()));
  const auto host = src.to(at::kCPU, options_.dtype().toScalarType()).contiguous().view({-1});
  swap_->write(s.group, s.partition_offset, host);
}

void Stage3Parameters::prefetch_pieces(int64_t unit) {
  if (!swap_) return;
  for (int64_t index : plan_->units().at(size_t(unit)).segments) {
    const auto& s = plan_->segments()[size_t(index)];
    swap_->prefetch(s.group, s.partition_offset, s.layout.partition_numel);
  }
}

at::Tensor Stage3Parameters::persistent_segment(int64_t group) {
  settle_lent();
  const int64_t tail = swap_ ? plan_->groups().at(size_t(group)).layout.partition_numel : 0;  // where weights_ starts
  for (int64_t index : plan_->groups().at(size_t(group)).segments) {
    const auto& s = plan_->segments()[size_t(index)];
    if (s.persistent()) return weights_[size_t(group)].narrow(0, s.gathered_offset - tail, s.layout.padded_numel);
  }
  return {};
}

at::Tensor Stage3Parameters::lend(int64_t group) {
  auto& whole = lent_.at(size_t(group));
  if (!whole.defined()) {
    const int64_t partition = plan_->groups()[size_t(group)].layout.partition_numel;
    auto paged = at::empty({plan_->weight_buffer_elements(group)}, at::dtype(options_.dtype().toScalarType()));
    swap_->read(group, 0, paged.narrow(0, 0, partition));
    paged.narrow(0, partition, paged.numel() - partition).copy_(weights_[size_t(group)]);
    lent_hashes_.at(size_t(group)) = XXH3_64bits(paged.data_ptr(), paged.nbytes());
    whole = std::move(paged);
  }
  return whole;
}

void Stage3Parameters::settle_lent() {
  if (!swap_) return;
  bool wrote = false;
  for (size_t g = 0; g < lent_.size(); ++g) {
    if (!lent_[g].defined()) continue;
    // Unchanged since it was paged in (a save, a sync): nothing to write. A hash, not a version
    // counter: the lenders' writers (a checkpoint load's executor) write through raw pointers.
    if (XXH3_64bits(lent_[g].data_ptr(), lent_[g].nbytes()) != lent_hashes_[g]) {
      const int64_t partition = plan_->groups()[g].layout.partition_numel;
      swap_->write(int64_t(g), 0, lent_[g].narrow(0, 0, partition));
      weights_[g].copy_(lent_[g].narrow(0, partition, lent_[g].numel() - partition));
      wrote = true;
    }
    lent_[g] = at::Tensor();
  }
  if (wrote) swap_->flush();
}

int64_t Stage3Parameters::resident_weight_bytes() const {
  int64_t n = 0;
  for (const auto& w : weights_) n += int64_t(w.numel() * w.element_size());
  for (const auto& w : lent_)
    if (w.defined()) n += int64_t(w.numel() * w.element_size());
  return n;
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
