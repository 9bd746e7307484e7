// StoreServer is the server of tessera's TCP store: the key-value map through which the ranks of
// one or more jobs meet (store.h is the handle everybody uses). It listens on the address it is
// given and nowhere else (the launcher gives 127.0.0.1 on one node), and lets in only peers that
// prove they hold the job's secret (store_protocol.h handshake); jobs that must meet (training and
// rollout) are started with the same secret. A refused peer is disconnected before it can read or
// write a key, and counted (refused()).
//
// One thread accepts connections and one thread serves each client; a blocking get or wait is
// held on the client's thread until its keys exist or its timeout passes. The destructor closes
// every connection and joins every thread.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tessera::transport::rendezvous {

class StoreServer {
 public:
  // Binds host:port (a name or numeric address; port 0 picks a free one). Throws TransportError
  // naming the address when it cannot.
  StoreServer(const std::string& host, int port, std::string secret);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  const std::string& bound_address() const { return address_; }  // "127.0.0.1:29500"
  int64_t refused() const { return refused_.load(); }

 private:
  void accept_loop();
  void serve(int fd);
  std::vector<uint8_t> handle(const std::vector<uint8_t>& request);

  std::string secret_;
  std::string address_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> refused_{0};
  std::thread acceptor_;
  std::mutex clients_mutex_;
  std::vector<int> client_fds_;
  std::vector<std::thread> clients_;
  // Linger at destruction (see ~StoreServer): connections open, requests being served, and when
  // the last request began or ended.
  std::condition_variable quiet_;
  int open_clients_ = 0;
  int in_flight_ = 0;
  std::chrono::steady_clock::time_point last_request_ = std::chrono::steady_clock::now();
  // The map.
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace tessera::transport::rendezvous
