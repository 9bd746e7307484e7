#include "actors/engine/stage3_driver.h"

#include <ATen/autocast_mode.h>

#include <algorithm>

#include "actors/ask.h"

namespace tessera::actors {

Stage3Driver::Stage3Driver(std::shared_ptr<const EngineSpec> spec, parameter_shard_actor shard,
                           std::shared_ptr<UnitGradStaging> staging, std::chrono::milliseconds bound)
    : spec_(std::move(spec)), shard_(std::move(shard)), staging_(std::move(staging)), bound_(bound) {
  const auto& plan = *spec_->plan;
  unit_of_.assign(plan.parameters().size(), -1);
  for (size_t u = 0; u < plan.units().size(); ++u) {
    for (int64_t p : plan.units()[u].params) unit_of_[size_t(p)] = int64_t(u);
    size_.push_back(int64_t(plan.units()[u].params.size()));
  }
  missing_ = size_;
  reported_.assign(plan.parameters().size(), 0);
  pins_.assign(plan.units().size(), 0);
  in_backward_.assign(plan.units().size(), 0);
}

void Stage3Driver::before_backward(int64_t unit) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_backward_.at(size_t(unit)) = 1;
  }
  fetch({unit, FetchKind::backward, Autocast::off});
}

void Stage3Driver::release(int64_t unit, ReleaseKind kind) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (pins_.at(size_t(unit)) > 0) return;
  }
  caf::anon_send(shard_, release_atom::value, ReleaseRequest{unit, kind});
}

void Stage3Driver::begin_forward() {
  if (!spec_->forward_windows || forward_depth_++ > 0) return;
  caf::anon_send(shard_, window_atom::value, WindowEdge::begin);
}

void Stage3Driver::end_forward() {
  if (!spec_->forward_windows || --forward_depth_ > 0) return;
  caf::anon_send(shard_, window_atom::value, WindowEdge::end);
  release_all();
}

bool Stage3Driver::pinned() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (int p : pins_)
    if (p > 0) return true;
  return false;
}

void Stage3Driver::pin(const std::vector<int64_t>& units) {
  for (int64_t u : units) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++pins_.at(size_t(u));
    }
    fetch({u, FetchKind::scope, Autocast::off});
  }
}

void Stage3Driver::unpin(const std::vector<int64_t>& units) {
  for (int64_t u : units) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (pins_.at(size_t(u)) > 0) --pins_[size_t(u)];
    }
    release(u);
  }
  // A scope's end is synchronous: the caller may hand the model to code that checks or copies its
  // parameters next, which must not race with the shard freeing them. (Messages from one thread
  // are handled in order, so this round trip comes after the releases.)
  (void)ask<Buffers>(shard_, bound_, "ZeRO-3: the parameter-shard (ending a gathered-parameters scope)", buffers_atom::value,
                     BufferContents::sizes);
}

bool Stage3Driver::autocast_enabled() { return at::autocast::is_cpu_enabled(); }

void Stage3Driver::fetch(const FetchRequest& request) {
  const auto t0 = std::chrono::steady_clock::now();
  struct Count {
    double& total;
    std::chrono::steady_clock::time_point t0;
    ~Count() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
  } count{wait_s_, t0};
  checked(ask<Done>(shard_, bound_,
                    "ZeRO-3: the parameter-shard (gathering unit '" + spec_->plan->units().at(size_t(request.unit)).module + "')",
                    fetch_atom::value, request));
}

void Stage3Driver::after_forward(int64_t unit, bool keep) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_backward_.at(size_t(unit))) return;  // a recomputation inside the unit's backward: still needed
  }
  // A training engine's forward without grad has no backward to reuse its units for: released.
  if (!keep) release(unit, c10::GradMode::is_enabled() || spec_->forward_windows ? ReleaseKind::after_use : ReleaseKind::now);
}

void Stage3Driver::grad_ready(int64_t param, bool reducing) {
  if (reducing) staging_->take(param);
  int64_t release = -1;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (param < 0 || size_t(param) >= reported_.size() || reported_[size_t(param)]) return;
    reported_[size_t(param)] = 1;
    const int64_t u = unit_of_[size_t(param)];
    if (u >= 0 && --missing_[size_t(u)] == 0) {
      release = u;
      in_backward_[size_t(u)] = 0;
    }
  }
  if (release >= 0) this->release(release, ReleaseKind::after_use);
}

void Stage3Driver::backward_ended() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    missing_ = size_;
    std::fill(reported_.begin(), reported_.end(), 0);
    std::fill(in_backward_.begin(), in_backward_.end(), 0);
  }
  release_all();
}

void Stage3Driver::release_all() {
  for (size_t u = 0; u < pins_.size(); ++u) release(int64_t(u));
}

}  // namespace tessera::actors
