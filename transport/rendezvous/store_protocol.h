// The wire protocol of tessera's TCP store (rendezvous/store_server.h, store_client.h): length-
// framed binary messages over one TCP connection per client, after an authentication handshake.
//
// Handshake: the server sends "TSTORE1" and a 32-byte random nonce; the client answers with
// HMAC-SHA256(secret, nonce); the server compares in constant time and answers one byte (1 = in,
// 0 = refused, then closes). A peer without the job's secret learns nothing and writes nothing.
// Frames: u32 length (little-endian) + payload. Requests: u8 op, then the op's fields; strings
// and byte strings are u32 length + bytes. Replies: u8 status (0 ok, 1 timeout, 2 error) + fields.
//   set(key, value) -> ok                 get(key, timeout_ms) -> value
//   add(key, i64) -> i64                  check(keys) -> u8
//   remove(key) -> u8                     wait(keys, timeout_ms) -> ok
//   num_keys -> i64                       compare_set(key, expected, desired) -> value
// Blocking ops (get, wait) are held by the server until the keys exist or the timeout passes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::transport::rendezvous {

enum class StoreOp : uint8_t { set = 1, get, add, check, remove, wait, num_keys, compare_set };
enum class StoreStatus : uint8_t { ok = 0, timeout = 1, error = 2 };

constexpr char kStoreGreeting[] = "TSTORE1";
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
constexpr uint32_t kMaxFrameBytes = 256u << 20;  // a frame larger than this is a broken peer

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

Nonce random_nonce();
Mac store_mac(const std::string& secret, const Nonce& nonce);
bool same_mac(const Mac& a, const Mac& b);  // constant time

// Builds and parses payloads; a Reader throws tessera::TransportError on a short or bad frame.
class Writer {
 public:
  Writer& u8(uint8_t v);
  Writer& i64(int64_t v);
  Writer& bytes(const std::string& v);
  Writer& bytes(const std::vector<uint8_t>& v);
  Writer& strings(const std::vector<std::string>& v);
  const std::vector<uint8_t>& data() const { return data_; }

 private:
  std::vector<uint8_t> data_;
};

class Reader {
 public:
  explicit Reader(const std::vector<uint8_t>& data) : data_(data) {}
  uint8_t u8();
  int64_t i64();
  std::string string();
  std::vector<uint8_t> bytes();
  std::vector<std::string> strings();

 private:
  const uint8_t* take(size_t n);
  const std::vector<uint8_t>& data_;
  size_t at_ = 0;
};

// Whole-frame and exact-size I/O on a blocking socket; false when the peer closed or failed.
bool send_all(int fd, const void* data, size_t n);
bool recv_all(int fd, void* data, size_t n);
bool send_frame(int fd, const std::vector<uint8_t>& payload);
bool recv_frame(int fd, std::vector<uint8_t>& payload);

}  // namespace tessera::transport::rendezvous
