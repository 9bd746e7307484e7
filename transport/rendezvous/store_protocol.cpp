#include "transport/rendezvous/store_protocol.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace tessera::transport::rendezvous {
namespace {

// OpenSSL without its atexit cleanup: a thread that used it (a store connection's server thread,
// an actor thread that connected) may exit after exit() has begun, and OpenSSL's thread-exit hook
// then touched freed state (a rank killed by SIGSEGV in libcrypto after its tests passed, once
// under load). The process ends right after anyway; the memory goes with it.
void init_crypto() {
  static const bool ready = OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, nullptr) == 1;
  if (!ready) throw TransportError("store: OpenSSL could not be initialised");
}

}  // namespace

Nonce random_nonce() {
  init_crypto();
  Nonce n{};
  if (RAND_bytes(n.data(), int(n.size())) != 1) throw TransportError("store: no random bytes for the handshake");
  return n;
}

Mac store_mac(const std::string& secret, const Nonce& nonce) {
  init_crypto();
  Mac mac{};
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), secret.data(), int(secret.size()), nonce.data(), nonce.size(), mac.data(), &length) ||
      length != mac.size())
    throw TransportError("store: HMAC-SHA256 failed");
  return mac;
}

bool same_mac(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

Writer& Writer::u8(uint8_t v) {
  data_.push_back(v);
  return *this;
}

Writer& Writer::i64(int64_t v) {
  for (int i = 0; i < 8; ++i) data_.push_back(uint8_t(uint64_t(v) >> (8 * i)));
  return *this;
}

Writer& Writer::bytes(const std::string& v) { return bytes(std::vector<uint8_t>(v.begin(), v.end())); }

Writer& Writer::bytes(const std::vector<uint8_t>& v) {
  const auto n = uint32_t(v.size());
  for (int i = 0; i < 4; ++i) data_.push_back(uint8_t(n >> (8 * i)));
  data_.insert(data_.end(), v.begin(), v.end());
  return *this;
}

Writer& Writer::strings(const std::vector<std::string>& v) {
  i64(int64_t(v.size()));
  for (const auto& s : v) bytes(s);
  return *this;
}

const uint8_t* Reader::take(size_t n) {
  if (n > data_.size() - at_) throw TransportError("store: a frame ended early (" + std::to_string(data_.size()) + " bytes)");
  const uint8_t* p = data_.data() + at_;
  at_ += n;
  return p;
}

uint8_t Reader::u8() { return *take(1); }

int64_t Reader::i64() {
  const uint8_t* p = take(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return int64_t(v);
}

std::vector<uint8_t> Reader::bytes() {
  const uint8_t* p = take(4);
  const uint32_t n = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
  const uint8_t* q = take(n);
  return std::vector<uint8_t>(q, q + n);
}

std::string Reader::string() {
  auto b = bytes();
  return std::string(b.begin(), b.end());
}

std::vector<std::string> Reader::strings() {
  const int64_t n = i64();
  if (n < 0 || uint64_t(n) > data_.size()) throw TransportError("store: a frame lists " + std::to_string(n) + " keys");
  std::vector<std::string> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(string());
  return out;
}

bool send_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    p += sent, n -= size_t(sent);
  }
  return true;
}

bool recv_all(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got, n -= size_t(got);
  }
  return true;
}

bool send_frame(int fd, const std::vector<uint8_t>& payload) {
  uint8_t header[4];
  const auto n = uint32_t(payload.size());
  for (int i = 0; i < 4; ++i) header[i] = uint8_t(n >> (8 * i));
  return send_all(fd, header, 4) && send_all(fd, payload.data(), payload.size());
}

bool recv_frame(int fd, std::vector<uint8_t>& payload) {
  uint8_t header[4];
  if (!recv_all(fd, header, 4)) return false;
  const uint32_t n = uint32_t(header[0]) | uint32_t(header[1]) << 8 | uint32_t(header[2]) << 16 | uint32_t(header[3]) << 24;
  if (n > kMaxFrameBytes) return false;
  payload.resize(n);
  return recv_all(fd, payload.data(), n);
}

}  // namespace tessera::transport::rendezvous
