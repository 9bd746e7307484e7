#include "transport/store.h"
#include "transport/liveness.h"

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <cstdlib>

#include "core/error.h"
#include "core/launch_env.h"
#include "transport/detail/c10d_store.h"
#include "transport/rendezvous/store_client.h"
#include "transport/rendezvous/store_server.h"

namespace tessera::transport {
namespace {


bool looks_like_timeout(const std::string& what) {
  return what.find("imeout") != std::string::npos || what.find("timed out") != std::string::npos;
}

}  // namespace

Store::Store(std::shared_ptr<Impl> impl, std::string job, std::string prefix, std::chrono::milliseconds timeout)
    : impl_(std::move(impl)), job_(std::move(job)), prefix_(std::move(prefix)), timeout_(timeout) {}

std::shared_ptr<Store> Store::tcp(const TcpStoreOptions& tcp, const StoreOptions& options) {
  if (tcp.port <= 0 || tcp.port > 65535)
    throw TransportError("store: port " + std::to_string(tcp.port) + " is not a TCP port (job '" + options.job + "')");
  auto impl = std::make_shared<Impl>();
  impl->where = "tcp store " + tcp.host + ":" + std::to_string(tcp.port);
  try {
    // The server binds the address it is given and nothing else; everybody, the server's own
    // process included, then connects as a client and proves it holds the secret.
    if (tcp.is_server) impl->server = std::make_shared<rendezvous::StoreServer>(tcp.host, tcp.port, tcp.secret);
    impl->store = c10::make_intrusive<rendezvous::StoreClient>(tcp.host, tcp.port, tcp.secret, tcp.connect_timeout,
                                                               options.timeout);
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::string msg = impl->where + (tcp.is_server && !impl->server ? ": cannot start the server" : ": cannot connect") +
                      " (job '" + options.job + "', within " + std::to_string(tcp.connect_timeout.count()) +
                      " ms): " + what.substr(0, what.find('\n'));
    if (looks_like_timeout(what)) throw TimeoutError(msg);
    throw TransportError(msg);
  }
  return std::make_shared<Store>(impl, options.job, options.job + "/", options.timeout);
}

std::shared_ptr<Store> Store::file(const std::string& path, const StoreOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->where = "file store " + path;
  try {
    // numWorkers only matters for deleting the file at the end: -1 keeps it (callers own the path).
    impl->store = c10::make_intrusive<c10d::FileStore>(path, -1);
    // Creates the file, so that waits before the first write find something to read.
    impl->store->add("tessera.opened", 1);
  } catch (const std::exception& e) {
    throw TransportError(impl->where + ": cannot open (job '" + options.job + "'): " + e.what());
  }
  impl->store->setTimeout(options.timeout);
  return std::make_shared<Store>(impl, options.job, options.job + "/", options.timeout);
}

std::shared_ptr<Store> Store::from_env(const StoreOptions& defaults) {
  start_heartbeat();  // a launched rank beats from the moment it joins its job
  StoreOptions options = defaults;
  const auto env = LaunchEnv::from_env();
  if (env.job_given) options.job = env.job;  // else the caller's default
  TcpStoreOptions tcp;
  tcp.host = env.master_addr;
  tcp.port = env.master_port;
  tcp.secret = env.store_secret;
  tcp.is_server = env.hosts_store;
  return Store::tcp(tcp, options);
}

void Store::set(const std::string& key, const std::vector<uint8_t>& value) {
  try {
    impl_->store->set(full(key), value);
  } catch (const std::exception& e) {
    throw TransportError(impl_->where + ": set '" + full(key) + "' (job '" + job_ + "') failed: " + e.what());
  }
}

void Store::set(const std::string& key, const std::string& value) {
  set(key, std::vector<uint8_t>(value.begin(), value.end()));
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  std::vector<std::string> full_keys;
  for (const auto& k : keys) full_keys.push_back(full(k));
  const auto t = bound(timeout);
  try {
    impl_->store->wait(full_keys, t);
  } catch (const std::exception& e) {
    std::string names;
    for (const auto& k : full_keys) names += (names.empty() ? "'" : ", '") + k + "'";
    std::string what = e.what();
    std::string msg = impl_->where + ": waiting for " + names + " (job '" + job_ + "')";
    if (looks_like_timeout(what))
      throw TimeoutError(msg + " timed out after " + std::to_string(t.count()) + " ms");
    throw TransportError(msg + " failed: " + what.substr(0, what.find('\n')));
  }
}

std::vector<uint8_t> Store::get(const std::string& key, std::chrono::milliseconds timeout) {
  wait({key}, timeout);
  try {
    return impl_->store->get(full(key));
  } catch (const std::exception& e) {
    throw TransportError(impl_->where + ": get '" + full(key) + "' (job '" + job_ + "') failed: " + e.what());
  }
}

std::string Store::get_string(const std::string& key, std::chrono::milliseconds timeout) {
  auto v = get(key, timeout);
  return std::string(v.begin(), v.end());
}

bool Store::check(const std::vector<std::string>& keys) {
  std::vector<std::string> full_keys;
  for (const auto& k : keys) full_keys.push_back(full(k));
  try {
    return impl_->store->check(full_keys);
  } catch (const std::exception& e) {
    throw TransportError(impl_->where + ": check (job '" + job_ + "') failed: " + e.what());
  }
}

int64_t Store::add(const std::string& key, int64_t delta) {
  try {
    return impl_->store->add(full(key), delta);
  } catch (const std::exception& e) {
    throw TransportError(impl_->where + ": add '" + full(key) + "' (job '" + job_ + "') failed: " + e.what());
  }
}

bool Store::remove(const std::string& key) {
  try {
    return impl_->store->deleteKey(full(key));
  } catch (const std::exception& e) {
    throw TransportError(impl_->where + ": delete '" + full(key) + "' (job '" + job_ + "') failed: " + e.what());
  }
}

std::shared_ptr<Store> Store::scoped(const std::string& name) const {
  return std::make_shared<Store>(impl_, job_, prefix_ + name + "/", timeout_);
}

std::shared_ptr<Store> Store::shared(const std::string& name) const {
  return std::make_shared<Store>(impl_, job_, "shared/" + name + "/", timeout_);
}

const std::string& Store::where() const { return impl_->where; }

c10::intrusive_ptr<c10d::Store> c10d_store(const Store& store, const std::string& sub_prefix) {
  std::string prefix = store.prefix() + sub_prefix;
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  return c10::make_intrusive<c10d::PrefixStore>(prefix, store.impl()->store);
}

}  // namespace tessera::transport
