#include "actors/bucket_staging.h"

#include <ATen/ATen.h>

#include "actors/detail/engine_shared.h"

namespace tessera::actors {

BucketStaging::BucketStaging(std::shared_ptr<const detail::EngineShared> shared) : shared_(std::move(shared)) {
  const auto& plan = shared_->plan;
  staging_.resize(plan.buckets.size());
  taken_.assign(plan.param_buckets.size(), 0);
  place_.resize(plan.param_buckets.size());
  for (size_t g = 0; g < shared_->groups.size(); ++g)
    for (size_t j = 0; j < shared_->groups[g].params.size(); ++j)
      place_[shared_->groups[g].params[j]] = {int64_t(g), int64_t(j)};
}

at::Tensor& BucketStaging::buffer(size_t k) {
  if (!staging_[k].defined()) {
    const auto& bucket = shared_->plan.buckets[k];
    staging_[k] = at::zeros({(bucket.end - bucket.begin) * shared_->world},
                            at::TensorOptions().dtype(shared_->groups[bucket.group].comm_dtype));
  }
  return staging_[k];
}

void BucketStaging::take(int64_t param) {
  if (param < 0 || size_t(param) >= taken_.size() || taken_[param]) return;
  taken_[param] = 1;
  const auto& plan = shared_->plan;
  const auto& p = shared_->parameters[param];
  if (!p.grad().defined()) return;  // zeros: the buffers start zeroed
  const auto grad = p.grad().reshape(-1);
  const auto& layout = shared_->groups[place_[param].first].flat->layout();
  for (int64_t k : plan.param_buckets[param]) {
    auto& staging = buffer(size_t(k));
    for (const auto& c : zero::staging_copies(layout, plan.shape, plan.buckets[k], place_[param].second))
      staging.narrow(0, c.staging_begin, c.length).copy_(grad.narrow(0, c.param_begin, c.length));
  }
  p.mutable_grad() = at::Tensor();
}

void BucketStaging::take_rest() {
  for (size_t param = 0; param < taken_.size(); ++param) take(int64_t(param));
}

at::Tensor BucketStaging::release(size_t k) {
  at::Tensor out = std::move(buffer(k));
  staging_[k] = at::Tensor();
  return out;
}

}  // namespace tessera::actors
