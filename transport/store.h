// A Store is the key-value store through which the processes of one or more jobs meet (rendezvous).
//
// It carries the small things that must be exchanged before anything else can talk: Gloo pair
// addresses, UCX worker addresses and remote keys, NCCL unique ids, plan digests. Values are byte
// strings; `get` blocks until the key exists. Two backends:
//   - TCP (tessera's own, rendezvous/store_server.h): one process (usually rank 0 of the first
//     job) runs the server, bound to the address it is given and nowhere else (127.0.0.1 on one
//     node); everyone connects to host:port and must prove it holds the job's secret
//     (TESSERA_STORE_SECRET, which tessera-launch sets; never on a command line). Several jobs may
//     share one server when they are given the same secret. Gloo and UCX peers find each other
//     only through it.
//   - File: c10d's, a file on a shared file system; single node (tests, one-machine runs).
//
// Namespaces: every key a Store handle sees is prefixed with "<job>/" (and with the sub-scopes of
// `scoped()`), so jobs and communicators never collide. `shared(name)` gives a handle on the
// namespace "shared/<name>/" that every job can reach: that is how two separately launched jobs
// find each other.
//
// Contract: every wait has a timeout (the handle's default or the call's); when it expires, a
// tessera::TimeoutError names the full key, the job and the timeout. Handles are cheap to copy
// (they share one connection) and thread-safe (c10d serializes operations per connection).
//
// Example: rank 0 of job "train" with MASTER_PORT=29500 does Store::from_env() (it hosts the
// server); rank 1 does the same (a client). store->set("hello", "x") on rank 0 writes key
// "train/hello"; rank 1's store->get_string("hello") returns "x" as soon as it exists.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config/config.h"  // the defaults of [tessera.transport] / [tessera.rollout], written once there

namespace tessera::transport {

struct StoreOptions {
  // The job namespace; every key gets the prefix "<job>/".
  std::string job = "default";
  // Default bound of every wait and get through this handle.
  std::chrono::milliseconds timeout{config::TransportConfig{}.collective_timeout_ms};
};

struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 29500;
  // Whether this process runs the server (exactly one process per host:port).
  bool is_server = false;
  // How long a client keeps trying to reach the server.
  std::chrono::milliseconds connect_timeout{config::TransportConfig{}.connect_timeout_ms};
  // What clients must prove they hold (HMAC-SHA256 of the server's nonce). Empty: an empty key,
  // i.e. anyone who can reach the address (only sensible on a single-user machine).
  std::string secret;
};

class Store {
 public:
  // A TCP store (server or client).
  static std::shared_ptr<Store> tcp(const TcpStoreOptions& tcp, const StoreOptions& options = {});
  // A store in one file; every process of the node opens the same path. The file is deleted when
  // the last handle of every process that opened it is gone (c10d's rule).
  static std::shared_ptr<Store> file(const std::string& path, const StoreOptions& options = {});
  // A TCP store from the launcher's environment: MASTER_ADDR, MASTER_PORT, TESSERA_JOB,
  // TESSERA_STORE_SECRET; rank 0
  // (RANK) hosts the server unless TESSERA_STORE_SERVER=0 (a second job joining a first one's
  // server) or another rank hosts it with TESSERA_STORE_SERVER=1.
  static std::shared_ptr<Store> from_env(const StoreOptions& defaults = {});

  // Writes (or overwrites) key.
  void set(const std::string& key, const std::vector<uint8_t>& value);
  void set(const std::string& key, const std::string& value);
  // Waits for key (at most `timeout`, the handle's default when zero), then returns its value.
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout = {});
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout = {});
  // Waits until every key exists.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout = {});
  // Whether every key exists now (no waiting).
  bool check(const std::vector<std::string>& keys);
  // Atomically adds delta to the integer stored at key (0 when absent); returns the new value.
  int64_t add(const std::string& key, int64_t delta);
  // Deletes key; false when it did not exist.
  bool remove(const std::string& key);

  // A handle on the sub-namespace "<prefix>/<name>/" (same connection).
  std::shared_ptr<Store> scoped(const std::string& name) const;
  // A handle on the namespace "shared/<name>/" that every job reaches (same connection).
  std::shared_ptr<Store> shared(const std::string& name) const;

  const std::string& job() const { return job_; }
  // The full prefix of this handle's keys, e.g. "train/comm/world/".
  const std::string& prefix() const { return prefix_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // What a TimeoutError/TransportError says about this store ("tcp 127.0.0.1:29500").
  const std::string& where() const;

  struct Impl;
  // For transport internals (detail/c10d_store.h).
  const std::shared_ptr<Impl>& impl() const { return impl_; }

  Store(std::shared_ptr<Impl> impl, std::string job, std::string prefix, std::chrono::milliseconds timeout);

 private:
  std::string full(const std::string& key) const { return prefix_ + key; }
  std::chrono::milliseconds bound(std::chrono::milliseconds t) const { return t.count() > 0 ? t : timeout_; }

  std::shared_ptr<Impl> impl_;
  std::string job_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tessera::transport
