#include "transport/rendezvous/store_client.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>

#include "core/error.h"
#include "transport/rendezvous/store_protocol.h"

namespace tessera::transport::rendezvous {
namespace {

int connect_once(const std::string& host, int port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0) {
    error = std::string("cannot resolve: ") + gai_strerror(rc);
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      error = std::strerror(errno);
      ::close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

void set_receive_timeout(int fd, int64_t ms) {
  timeval t{time_t(ms / 1000), suseconds_t((ms % 1000) * 1000)};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &t, sizeof t);
}

}  // namespace

c10::intrusive_ptr<c10d::Store> StoreClient::clone() {
  return c10::make_intrusive<StoreClient>(host_, port_, secret_, connect_timeout_, timeout_);
}

StoreClient::StoreClient(const std::string& host, int port, const std::string& secret,
                         std::chrono::milliseconds connect_timeout, std::chrono::milliseconds timeout)
    : c10d::Store(timeout),
      host_(host),
      port_(port),
      secret_(secret),
      connect_timeout_(connect_timeout),
      where_("tcp store " + host + ":" + std::to_string(port)) {
  const auto deadline = std::chrono::steady_clock::now() + connect_timeout;
  std::string error = "no attempt";
  for (;;) {
    fd_ = connect_once(host, port, error);
    if (fd_ >= 0) break;
    if (std::chrono::steady_clock::now() >= deadline)
      throw TimeoutError(where_ + ": cannot connect within " + std::to_string(connect_timeout.count()) +
                         " ms (Timeout; last error: " + error + ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  set_receive_timeout(fd_, 30000);
  char greeting[sizeof kStoreGreeting - 1];
  Nonce nonce{};
  if (!recv_all(fd_, greeting, sizeof greeting) || std::memcmp(greeting, kStoreGreeting, sizeof greeting) != 0 ||
      !recv_all(fd_, nonce.data(), nonce.size())) {
    ::close(fd_);
    throw TransportError(where_ + ": the peer is not a tessera store (no handshake)");
  }
  const Mac mac = store_mac(secret, nonce);
  uint8_t verdict = 0;
  if (!send_all(fd_, mac.data(), mac.size()) || !recv_all(fd_, &verdict, 1) || verdict != 1) {
    ::close(fd_);
    throw TransportError(where_ + ": the store refused this process: it does not hold the job's secret "
                         "(TESSERA_STORE_SECRET must be the same as the server's)");
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<uint8_t> StoreClient::call(const std::vector<uint8_t>& request, int64_t blocking_ms, const std::string& what) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The reply may be held for blocking_ms; give the connection that plus a margin.
  set_receive_timeout(fd_, blocking_ms + 30000);
  std::vector<uint8_t> reply;
  if (!send_frame(fd_, request) || !recv_frame(fd_, reply))
    throw TransportError(where_ + ": " + what + ": the connection to the store was lost");
  if (reply.empty()) throw TransportError(where_ + ": " + what + ": an empty reply");
  const auto status = StoreStatus(reply[0]);
  if (status == StoreStatus::timeout)
    throw std::runtime_error(where_ + ": " + what + ": Timeout after " + std::to_string(blocking_ms) + " ms");
  if (status == StoreStatus::error) {
    std::vector<uint8_t> rest(reply.begin() + 1, reply.end());
    throw TransportError(where_ + ": " + what + ": the server failed: " + Reader(rest).string());
  }
  return std::vector<uint8_t>(reply.begin() + 1, reply.end());
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call(Writer().u8(uint8_t(StoreOp::set)).bytes(key).bytes(value).data(), 0, "set '" + key + "'");
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  auto r = call(Writer().u8(uint8_t(StoreOp::compare_set)).bytes(key).bytes(expected).bytes(desired).data(), 0,
                "compare_set '" + key + "'");
  return Reader(r).bytes();
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  const int64_t ms = timeout_.count();
  auto r = call(Writer().u8(uint8_t(StoreOp::get)).bytes(key).i64(ms).data(), ms, "get '" + key + "'");
  return Reader(r).bytes();
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  auto r = call(Writer().u8(uint8_t(StoreOp::add)).bytes(key).i64(value).data(), 0, "add '" + key + "'");
  return Reader(r).i64();
}

bool StoreClient::deleteKey(const std::string& key) {
  auto r = call(Writer().u8(uint8_t(StoreOp::remove)).bytes(key).data(), 0, "delete '" + key + "'");
  return Reader(r).u8() != 0;
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  auto r = call(Writer().u8(uint8_t(StoreOp::check)).strings(keys).data(), 0, "check");
  return Reader(r).u8() != 0;
}

int64_t StoreClient::getNumKeys() {
  auto r = call(Writer().u8(uint8_t(StoreOp::num_keys)).data(), 0, "num_keys");
  return Reader(r).i64();
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void StoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const int64_t ms = timeout.count() > 0 ? timeout.count() : timeout_.count();
  call(Writer().u8(uint8_t(StoreOp::wait)).strings(keys).i64(ms).data(), ms, "wait");
}

}  // namespace tessera::transport::rendezvous
