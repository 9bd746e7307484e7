#include "actors/actor_runtime.h"

#include <caf/all.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>

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
  auto env = [](const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return std::string(v && *v ? v : fallback);
  };
  transport::TcpStoreOptions tcp;
  tcp.host = env("MASTER_ADDR", "127.0.0.1");
  tcp.port = std::stoi(env("MASTER_PORT", "29500"));  // job_store() has checked it
  tcp.secret = env("TESSERA_STORE_SECRET", "");
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
