// CAF check for `tessera doctor`: two actors, one request/response with a timeout.
#include <caf/all.hpp>

#include <chrono>
#include <stdexcept>
#include <string>

#include "tools/tessera/doctor/checks.h"

namespace tessera::cli::doctor {
namespace {

using square_atom = caf::atom_constant<caf::atom("square")>;
using relay_atom = caf::atom_constant<caf::atom("relay")>;

caf::behavior squarer(caf::event_based_actor*) {
  return {[](square_atom, int32_t x) { return x * x; }};
}

// Asks the squarer on behalf of its caller: a request between two actors, not just to one.
caf::behavior relay(caf::event_based_actor* self, caf::actor target) {
  return {[=](relay_atom, int32_t x) -> caf::result<int32_t> {
    auto promise = self->make_response_promise<int32_t>();
    self->request(target, std::chrono::seconds(5), square_atom::value, x)
        .then([=](int32_t y) mutable { promise.deliver(y); },
              [=](caf::error& e) mutable { promise.deliver(std::move(e)); });
    return promise;
  }};
}

}  // namespace

std::string caf_version() {
  return std::to_string(CAF_MAJOR_VERSION) + "." + std::to_string(CAF_MINOR_VERSION) + "." +
         std::to_string(CAF_PATCH_VERSION);
}

std::string check_caf_request_response() {
  caf::actor_system_config config;
  config.set("scheduler.max-threads", 2);
  caf::actor_system system{config};
  auto target = system.spawn(squarer);
  auto middle = system.spawn(relay, target);
  caf::scoped_actor self{system};
  int32_t answer = -1;
  std::string failure;
  self->request(middle, std::chrono::seconds(5), relay_atom::value, int32_t{12})
      .receive([&](int32_t y) { answer = y; },
               [&](caf::error& e) { failure = system.render(e); });
  self->send_exit(middle, caf::exit_reason::user_shutdown);
  self->send_exit(target, caf::exit_reason::user_shutdown);
  if (!failure.empty()) throw std::runtime_error("request failed: " + failure);
  if (answer != 144) throw std::runtime_error("relay(12) returned " + std::to_string(answer) + ", expected 144");
  return "relay -> squarer: 12^2 = 144";
}

}  // namespace tessera::cli::doctor
