#include "transport/rendezvous/store_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "transport/rendezvous/store_protocol.h"

namespace tessera::transport::rendezvous {
namespace {

std::string numeric(const sockaddr* a, socklen_t n) {
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(a, n, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0) return "?";
  return std::string(host) + ":" + serv;
}

}  // namespace

StoreServer::StoreServer(const std::string& host, int port, std::string secret) : secret_(std::move(secret)) {
  const std::string where = "store server " + host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); rc != 0)
    throw TransportError(where + ": cannot resolve the address: " + gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 256) == 0) {
      sockaddr_storage bound{};
      socklen_t n = sizeof bound;
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &n);
      address_ = numeric(reinterpret_cast<sockaddr*>(&bound), n);
      port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                 : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) throw TransportError(where + ": cannot listen: " + last_error);
  acceptor_ = std::thread([this] { accept_loop(); });
}

StoreServer::~StoreServer() {
  // No new peers; then peers still connected are served until they hang up or go quiet: a rank
  // that exits right after setting its last key (a sync's verdict) must not cut off a slower rank
  // about to read it ("the connection to the store was lost" in rollout.grpo, now and then under
  // load; a 300 ms quiet was not enough for a rank descheduled between two requests). Quiet: no
  // request under way for kQuiet; the host's own client may stay connected, so at worst this
  // waits kLinger.
  constexpr std::chrono::milliseconds kQuiet{2000}, kLinger{10000};
  ::shutdown(listen_fd_, SHUT_RDWR);
  ::close(listen_fd_);
  acceptor_.join();
  {
    std::unique_lock<std::mutex> lock(clients_mutex_);
    const auto give_up = std::chrono::steady_clock::now() + kLinger;
    while (open_clients_ > 0 && std::chrono::steady_clock::now() < give_up) {
      if (in_flight_ == 0 && std::chrono::steady_clock::now() - last_request_ >= kQuiet) break;
      quiet_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  stopping_ = true;
  changed_.notify_all();
  {
    std::lock_guard<std::mutex> lock(clients_mutex_);
    for (int fd : client_fds_) ::shutdown(fd, SHUT_RDWR);
  }
  changed_.notify_all();
  for (auto& t : clients_) t.join();
  for (int fd : client_fds_) ::close(fd);
}

void StoreServer::accept_loop() {
  // Ends when the destructor shuts the listening socket (accept fails).
  while (!stopping_) {
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      return;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(clients_mutex_);
    client_fds_.push_back(fd);
    ++open_clients_;
    clients_.emplace_back([this, fd] {
      serve(fd);
      std::lock_guard<std::mutex> done(clients_mutex_);
      --open_clients_;
      quiet_.notify_all();
    });
  }
}

void StoreServer::serve(int fd) {
  // Handshake: a peer that does not answer the nonce with the secret's MAC within 10 s is out.
  timeval handshake{10, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &handshake, sizeof handshake);
  const Nonce nonce = random_nonce();
  Mac answer{};
  if (!send_all(fd, kStoreGreeting, sizeof kStoreGreeting - 1) || !send_all(fd, nonce.data(), nonce.size()) ||
      !recv_all(fd, answer.data(), answer.size()) || !same_mac(answer, store_mac(secret_, nonce))) {
    ++refused_;
    const uint8_t no = 0;
    send_all(fd, &no, 1);
    ::shutdown(fd, SHUT_RDWR);
    return;
  }
  const uint8_t yes = 1;
  if (!send_all(fd, &yes, 1)) return;
  timeval forever{0, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever);
  std::vector<uint8_t> request;
  auto note_request = [this](int delta) {
    std::lock_guard<std::mutex> lock(clients_mutex_);
    in_flight_ += delta;
    last_request_ = std::chrono::steady_clock::now();
    quiet_.notify_all();
  };
  while (!stopping_ && recv_frame(fd, request)) {
    note_request(+1);
    std::vector<uint8_t> reply;
    try {
      reply = handle(request);
    } catch (const std::exception& e) {
      reply = Writer().u8(uint8_t(StoreStatus::error)).bytes(std::string(e.what())).data();
    }
    const bool sent = send_frame(fd, reply);
    note_request(-1);
    if (!sent) return;
  }
}

std::vector<uint8_t> StoreServer::handle(const std::vector<uint8_t>& request) {
  Reader in(request);
  const auto op = StoreOp(in.u8());
  Writer ok;
  ok.u8(uint8_t(StoreStatus::ok));
  auto wait_for = [&](const std::vector<std::string>& keys, int64_t timeout_ms, std::unique_lock<std::mutex>& lock) {
    auto all = [&] {
      for (const auto& k : keys)
        if (!data_.count(k)) return false;
      return true;
    };
    return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return stopping_ || all(); }) && all();
  };
  std::unique_lock<std::mutex> lock(mutex_);
  switch (op) {
    case StoreOp::set: {
      auto key = in.string();
      data_[key] = in.bytes();
      changed_.notify_all();
      return ok.data();
    }
    case StoreOp::get: {
      auto key = in.string();
      const int64_t timeout_ms = in.i64();
      if (!wait_for({key}, timeout_ms, lock)) return Writer().u8(uint8_t(StoreStatus::timeout)).data();
      return ok.bytes(data_.at(key)).data();
    }
    case StoreOp::add: {
      auto key = in.string();
      const int64_t delta = in.i64();
      int64_t value = 0;
      if (auto it = data_.find(key); it != data_.end()) value = std::stoll(std::string(it->second.begin(), it->second.end()));
      value += delta;
      const auto text = std::to_string(value);
      data_[key] = std::vector<uint8_t>(text.begin(), text.end());
      changed_.notify_all();
      return ok.i64(value).data();
    }
    case StoreOp::check: {
      bool all = true;
      for (const auto& k : in.strings()) all = all && data_.count(k) > 0;
      return ok.u8(all ? 1 : 0).data();
    }
    case StoreOp::remove: {
      const bool existed = data_.erase(in.string()) > 0;
      return ok.u8(existed ? 1 : 0).data();
    }
    case StoreOp::wait: {
      auto keys = in.strings();
      const int64_t timeout_ms = in.i64();
      if (!wait_for(keys, timeout_ms, lock)) return Writer().u8(uint8_t(StoreStatus::timeout)).data();
      return ok.data();
    }
    case StoreOp::num_keys:
      return ok.i64(int64_t(data_.size())).data();
    case StoreOp::compare_set: {
      auto key = in.string();
      auto expected = in.bytes();
      auto desired = in.bytes();
      auto it = data_.find(key);
      if (it == data_.end()) {
        if (expected.empty()) data_[key] = desired;
        changed_.notify_all();
        return ok.bytes(expected.empty() ? desired : expected).data();
      }
      if (it->second == expected) it->second = desired;
      changed_.notify_all();
      return ok.bytes(it->second).data();
    }
  }
  throw TransportError("store: unknown request " + std::to_string(int(op)));
}

}  // namespace tessera::transport::rendezvous
