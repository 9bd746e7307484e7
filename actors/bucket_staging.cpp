#include "actors/bucket_staging.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "core/error.h"

namespace tessera::actors {

BucketStaging::BucketStaging(std::shared_ptr<const EngineSpec> spec, std::vector<at::Tensor> parameters, int slots)
    : spec_(std::move(spec)), parameters_(std::move(parameters)), ring_(slots) {
  const auto& plan = *spec_->plan;
  for (const auto& b : plan.buckets().buckets)
    slot_bytes_ = std::max<int64_t>(slot_bytes_, b.elements() * int64_t(c10::elementSize(spec_->comm_dtype(b.group))));
  for (int s = 0; s < slots; ++s)
    slots_.push_back(at::empty({slot_bytes_}, at::TensorOptions().dtype(at::kByte).device(spec_->device)));
  const size_t n = parameters_.size(), k = plan.buckets().buckets.size();
  ready_.assign(n, 0);
  uncopied_.assign(n, 0);
  done_.resize(n);
  missing_.assign(k, 0);
  slot_of_.assign(k, -1);
}

at::Tensor BucketStaging::bucket_view(size_t k) const {
  const auto& b = spec_->plan->buckets().buckets[k];
  const auto dtype = spec_->comm_dtype(b.group);
  const int64_t bytes = b.elements() * int64_t(c10::elementSize(dtype));
  return slots_[size_t(slot_of_[k])].narrow(0, 0, bytes).view(dtype);
}

void BucketStaging::start() {
  const auto& plan = *spec_->plan;
  std::fill(ready_.begin(), ready_.end(), 0);
  for (size_t p = 0; p < parameters_.size(); ++p) {
    uncopied_[p] = int(plan.buckets().param_buckets[p].size());
    done_[p].assign(plan.buckets().param_buckets[p].size(), 0);
  }
  for (size_t k = 0; k < missing_.size(); ++k) missing_[k] = int64_t(plan.buckets().buckets[k].params.size());
  std::fill(slot_of_.begin(), slot_of_.end(), -1);
  assigned_ = 0;
}

void BucketStaging::copy(int64_t param, size_t k) {
  const auto& plan = *spec_->plan;
  const auto& bucket = plan.buckets().buckets[k];
  const auto [group, index] = plan.place(param);
  const auto c = zero::staging_copy(plan.groups()[size_t(group)].layout, bucket, index);
  auto target = bucket_view(k).narrow(0, c.staging_begin, c.length);
  const auto& grad = parameters_[size_t(param)].grad();
  if (grad.defined()) target.copy_(grad.reshape(-1).narrow(0, c.param_begin, c.length));
  else target.zero_();
  // Bookkeeping: this parameter's part of bucket k is in; a complete bucket goes to the reducer.
  const auto& own = plan.buckets().param_buckets[size_t(param)];
  const size_t position = size_t(std::find(own.begin(), own.end(), int64_t(k)) - own.begin());
  done_[size_t(param)][position] = 1;
  if (--uncopied_[size_t(param)] == 0) parameters_[size_t(param)].mutable_grad() = at::Tensor();
  if (--missing_[k] == 0) caf::anon_send(reducer_, bucket_atom::value, StagedBucket{k, slot_of_[k], bucket_view(k)});
}

void BucketStaging::assign_free_slots() {
  const auto& plan = *spec_->plan;
  std::vector<size_t> fresh;
  int slot = -1;
  while (assigned_ < slot_of_.size() && ring_.try_take(slot)) {
    slot_of_[assigned_] = slot;
    fresh.push_back(assigned_++);
  }
  // Parameters already final that waited for these buckets (deferred) are copied now.
  for (size_t k : fresh)
    for (int64_t p : plan.buckets().buckets[k].params)
      if (ready_[size_t(p)]) copy(p, k);
}

void BucketStaging::copy_assigned(int64_t param) {
  const auto& own = spec_->plan->buckets().param_buckets[size_t(param)];
  for (size_t i = 0; i < own.size(); ++i)
    if (!done_[size_t(param)][i] && slot_of_[size_t(own[i])] >= 0) copy(param, size_t(own[i]));
}

bool BucketStaging::may_wait_for(int64_t param) const {
  // Only when the parameter's next bucket is the next to get a slot and every bucket holding a
  // slot is complete (sent): then those reductions are issued on every rank and their slots
  // come back whatever autograd does next. Otherwise the parameter waits (deferred) instead.
  const auto& own = spec_->plan->buckets().param_buckets[size_t(param)];
  size_t first = own.size();
  for (size_t i = 0; i < own.size(); ++i)
    if (!done_[size_t(param)][i]) {
      first = i;
      break;
    }
  if (first == own.size() || size_t(own[first]) != assigned_) return false;
  for (size_t k = 0; k < assigned_; ++k)
    if (missing_[k] != 0) return false;
  return true;
}

void BucketStaging::wait_for_slot() {
  caf::anon_send(reducer_, reclaim_atom::value);  // finish the oldest reduction now
  ring_.wait_for_free(spec_->timeout, "gradient staging: bucket " + std::to_string(assigned_) + " of " +
                                          std::to_string(slot_of_.size()) +
                                          " waits: no bucket buffer came back from the gradient-reducer");
}

void BucketStaging::take(int64_t param) {
  if (param < 0 || size_t(param) >= parameters_.size() || ready_[size_t(param)]) return;
  ready_[size_t(param)] = 1;
  assign_free_slots();
  copy_assigned(param);
  // Bounded memory: a parameter next in line waits for a slot instead of keeping its .grad.
  while (uncopied_[size_t(param)] > 0 && may_wait_for(param)) {
    wait_for_slot();
    assign_free_slots();
    copy_assigned(param);
  }
}

void BucketStaging::take_rest() {
  for (size_t p = 0; p < parameters_.size(); ++p) take(int64_t(p));
  // Every parameter is final now, so every bucket holding a slot is complete and sent.
  while (assigned_ < slot_of_.size()) {
    assign_free_slots();
    if (assigned_ < slot_of_.size()) wait_for_slot();
  }
}

void BucketStaging::give_back(int slot) { ring_.give_back(slot); }

}  // namespace tessera::actors
