#include "actors/weight_departures.h"

#include "actors/actor_runtime.h"
#include "core/error.h"
#include "core/optim/state_store.h"

namespace tessera::actors {

void WeightDepartures::send(int64_t slot, size_t group, size_t sub, int64_t begin, const at::Tensor& master,
                            const at::Tensor& target) {
  WeightsToDevice out{slot, master, target};
  leaving_.push_back(Departure{self_->request(offload_, bound_, to_device_atom::value, std::move(out)), group, sub, begin, target});
}

void WeightDepartures::take_oldest() {
  auto& d = leaving_.front();
  bool copied = false;
  d.request.receive(
      [&](Done& done) {
        if (done.error && !failure_) failure_ = done.error;
        copied = !done.error;
      },
      [&](caf::error& e) {
        if (!failure_)
          failure_ = std::make_exception_ptr(Error("optimizer-shard: the offload actor did not answer (weights to the "
                                                   "device): " + actor_system().render(e)));
      });
  try {
    if (copied) parameters_.release(d.group, d.begin, d.target);  // parameters on NVMe: into the swap
  } catch (...) {
    if (!failure_) failure_ = std::current_exception();
  }
  store_.release(int64_t(d.group), int64_t(d.sub));
  leaving_.pop_front();
}

void WeightDepartures::take_all() {
  while (!leaving_.empty()) take_oldest();
}

}  // namespace tessera::actors
