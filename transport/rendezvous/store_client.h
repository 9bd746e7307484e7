// StoreClient is a connection to a StoreServer (store_server.h), presented to LibTorch as a
// c10d::Store so that Gloo's rendezvous runs over it unchanged. It connects (retrying until
// connect_timeout, as the server may start later), proves it holds the job's secret and then
// sends one request at a time (a mutex: threads of one process share the connection, as they do
// with c10d's TCPStore). A refused handshake is a TransportError that says so; a wait that
// passes its timeout throws an error whose text contains "Timeout" (store.cpp turns it into a
// tessera::TimeoutError naming the keys).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <mutex>
#include <string>
#include <vector>

namespace tessera::transport::rendezvous {

class StoreClient : public c10d::Store {
 public:
  StoreClient(const std::string& host, int port, const std::string& secret, std::chrono::milliseconds connect_timeout,
              std::chrono::milliseconds timeout);
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // LibTorch 2.x's c10d::Store::clone (pure virtual there, absent in 1.13: hence no `override`):
  // a new connection to the same server, with the same secret and timeouts.
  c10::intrusive_ptr<c10d::Store> clone();

 private:
  // Sends a request and returns the reply's reader position (status checked); `blocking_ms` is
  // how long the server may hold it.
  std::vector<uint8_t> call(const std::vector<uint8_t>& request, int64_t blocking_ms, const std::string& what);

  std::string host_;
  int port_;
  std::string secret_;
  std::chrono::milliseconds connect_timeout_;
  std::string where_;
  int fd_ = -1;
  std::mutex mutex_;
};

}  // namespace tessera::transport::rendezvous
