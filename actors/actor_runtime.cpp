#include "actors/actor_runtime.h"

#include <caf/all.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>

#include "core/launch_env.h"
#include "transport/store.h"

namespace tessera::actors {

caf::actor_system& actor_system() {
  static caf::actor_system* system = [] {
    static caf::actor_system_config config;  // must outlive the system
    config.set("scheduler.max-threads", 2);
    // Workers wait on a condition variable when idle; the default work-stealing policy polls,
    // which costs ~10% of a core per worker for nothing (tessera's actors are detached).
    config.set("scheduler.policy", caf::atom("sharing"));
    return new caf::actor_system(config);
  }();
  return *system;
}

std::shared_ptr<transport::Store> job_store() {
  static std::mutex mutex;
  static std::shared_ptr<transport::Store> store;
  std::lock_guard<std::mutex> lock(mutex);
  if (!store) store = transport::Store::from_env();
  return store;
}

std::shared_ptr<transport::Store> own_job_store_connection() {
  const auto first = job_store();
  const auto env = LaunchEnv::from_env();
  transport::TcpStoreOptions tcp;
  tcp.host = env.master_addr;
  tcp.port = env.master_port;
  tcp.secret = env.store_secret;
  tcp.is_server = false;
  transport::StoreOptions options;
  options.job = first->job();
  options.timeout = first->timeout();
  return transport::Store::tcp(tcp, options);
}

std::string next_communicator_name(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + std::to_string(counter++);
}

}  // namespace tessera::actors
