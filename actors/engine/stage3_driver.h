// Stage3Driver is a ZeRO-3 engine's listener on its units (core/zero/unit_hooks.h): it turns the
// unit holders' calls and autograd's gradient reports into requests to the parameter-shard
// (fetch, release) and into the gradient staging's reductions.
//
//   before_forward / before_backward   fetch the unit (waits for the gather; a gathered unit is
//                                      not gathered again)
//   after_forward                      release it, unless the holder asks to keep it or its
//                                      backward has begun (a forward run again inside backward:
//                                      torch.utils.checkpoint's non-reentrant recomputation runs
//                                      while the unit's own backward node waits for what it
//                                      recomputes); the shard keeps it if it is reused soon
//                                      (stage3_max_reuse_distance)
//   grad_ready(param)                  during a reducing backward the staging takes the
//                                      gradient; when every parameter of its unit has reported,
//                                      the unit is released
//   backward_ended                     releases every unit still gathered
//   pin / unpin                        a gathered-parameters scope: fetched now, released by
//                                      nobody until the last unpin, which waits for the release
//   begin_forward / end_forward        ZeRO inference: Engine::forward is one prefetch window;
//                                      its end releases everything
// (The other releases are messages the caller does not wait for.)
// Everything runs on the user's thread or on autograd's (the same thread on CPU), one call at a
// time; the driver keeps only counters, and the parameter-shard owns the storage.
#pragma once

#include <c10/core/GradMode.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "actors/engine_spec.h"
#include "actors/protocol.h"
#include "actors/unit_grad_staging.h"
#include "core/zero/unit_hooks.h"

namespace tessera::actors {

class Stage3Driver final : public zero::UnitListener {
 public:
  Stage3Driver(std::shared_ptr<const EngineSpec> spec, parameter_shard_actor shard,
               std::shared_ptr<UnitGradStaging> staging, std::chrono::milliseconds bound);

  // A forward without grad prefetches nothing: no backward follows it (an eval leaves nothing gathered).
  void before_forward(int64_t unit) override {
    fetch({unit, c10::GradMode::is_enabled() ? FetchKind::forward : FetchKind::forward_no_grad,
           autocast_enabled() ? Autocast::on : Autocast::off});
  }
  void after_forward(int64_t unit, bool keep) override;
  void before_backward(int64_t unit) override;

  void grad_ready(int64_t param, bool reducing);
  void backward_ended();
  void release_all();
  void begin_forward();  // (nested calls: the outermost is the window)
  void end_forward();
  void pin(const std::vector<int64_t>& units);    // in ascending order: a collective, same on every rank
  void unpin(const std::vector<int64_t>& units);
  double fetch_wait_s() const { return wait_s_; }
  bool pinned();  // some gathered-parameters scope is open

 private:
  void fetch(const FetchRequest& request);  // waits for the gather
  static bool autocast_enabled();      // LibTorch's CPU autocast, on this thread
  void release(int64_t unit, ReleaseKind kind = ReleaseKind::now);  // unless pinned

  std::shared_ptr<const EngineSpec> spec_;
  parameter_shard_actor shard_;
  std::shared_ptr<UnitGradStaging> staging_;
  std::chrono::milliseconds bound_;
  std::mutex mutex_;
  std::vector<int64_t> unit_of_;   // per parameter: its unit, or -1 (persistent)
  std::vector<int64_t> size_;      // per unit: its parameters
  std::vector<int64_t> missing_;   // per unit: parameters not reported in this backward
  std::vector<char> reported_;     // per parameter, this backward
  std::vector<char> in_backward_;  // per unit: before_backward came and not all of its gradients yet
  std::vector<int> pins_;          // per unit: open gathered-parameters scopes holding it
  double wait_s_ = 0;              // the caller's thread waiting in fetch()
  int forward_depth_ = 0;          // Engine::forward calls open (the user's thread)
};

}  // namespace tessera::actors
