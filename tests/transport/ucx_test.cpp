// UCX between processes through tessera-launch: put/get/tagged messages inside one job, and two
// separately launched jobs of different sizes that meet through a shared store namespace
// (run by two_jobs.py). Every byte is checked (bitwise) against a closed-form pattern.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "transport/launch_env.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_endpoint.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

using namespace tessera::transport;

namespace {

std::string env_str(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

const auto kTimeout = std::chrono::seconds(60);

// Byte i of the chunk that (job tag j, rank r) sends: a hash that differs per job, rank and index.
uint8_t pattern(int j, int r, size_t i) { return static_cast<uint8_t>((i * 2654435761u + r * 97 + j * 31 + (i >> 8)) & 0xff); }

std::vector<uint8_t> chunk_of(int j, int r, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  for (size_t i = 0; i < bytes; ++i) v[i] = pattern(j, r, i);
  return v;
}

uint64_t tag(int kind, int job, int rank) { return (uint64_t(kind) << 40) | (uint64_t(job) << 20) | uint64_t(rank); }

struct Process {
  int rank = env_int("RANK", 0);
  int size = env_int("WORLD_SIZE", 1);
  std::string job = env_str("TESSERA_JOB", "default");
  std::shared_ptr<Store> store = Store::from_env();
  UcxContext context{UcxContextOptions{}};
};

}  // namespace

TEST_CASE("UCX put, get and tagged messages inside one job", "[ucx]") {
  Process p;
  UcxPeers peers(p.context, p.store, p.job, p.rank, p.size, "ucx-" + p.job);
  REQUIRE(peers.connect(p.job) == p.size);
  // Each rank owns a buffer with one chunk per rank (prime size: no alignment luck), first NaN.
  const size_t chunk = (4 << 20) + 13;
  std::vector<float> nan_fill((chunk * p.size + 3) / 4, std::numeric_limits<float>::quiet_NaN());
  auto* buffer = reinterpret_cast<uint8_t*>(nan_fill.data());
  UcxMemory memory(p.context, buffer, chunk * p.size);
  peers.publish_memory("buffer", memory);

  // Put my chunk into every rank's buffer (myself included) at offset rank*chunk.
  auto mine = chunk_of(0, p.rank, chunk);
  for (int q = 0; q < p.size; ++q) {
    auto& ep = peers.endpoint(p.job, q);
    ep.put(mine.data(), chunk, peers.remote_key(p.job, q, "buffer"), p.rank * chunk, kTimeout);
    ep.flush(kTimeout);
    uint32_t hello = 0xC0DE0000u + p.rank;
    ep.send(&hello, sizeof hello, tag(1, 0, p.rank), kTimeout);
  }
  for (int q = 0; q < p.size; ++q) {
    uint32_t got = 0;
    REQUIRE(ucx_receive(p.context, &got, sizeof got, tag(1, 0, q), kTimeout) == sizeof got);
    CHECK(got == 0xC0DE0000u + q);
  }
  for (int q = 0; q < p.size; ++q) {
    auto expect = chunk_of(0, q, chunk);
    CHECK(std::memcmp(buffer + q * chunk, expect.data(), chunk) == 0);
  }
  // Everyone has checked its buffer (so every buffer is complete) before anyone reads one back.
  for (int q = 0; q < p.size; ++q) {
    uint8_t checked = 1;
    peers.endpoint(p.job, q).send(&checked, 1, tag(4, 0, p.rank), kTimeout);
  }
  for (int q = 0; q < p.size; ++q) {
    uint8_t checked = 0;
    ucx_receive(p.context, &checked, 1, tag(4, 0, q), kTimeout);
  }
  // Get the next rank's whole buffer; it holds every rank's chunk.
  int next = (p.rank + 1) % p.size;
  std::vector<uint8_t> fetched(chunk * p.size, 0);
  auto& ep = peers.endpoint(p.job, next);
  ep.get(fetched.data(), fetched.size(), peers.remote_key(p.job, next, "buffer"), 0, kTimeout);
  ep.flush(kTimeout);
  CHECK(std::memcmp(fetched.data(), buffer, fetched.size()) == 0);
  // A large tagged message around the ring (rendezvous protocol: receive posted before waiting).
  int prev = (p.rank + p.size - 1) % p.size;
  std::vector<uint8_t> big = chunk_of(2, p.rank, 3 << 20), big_in(3 << 20);
  auto receiving = ucx_receive_async(p.context, big_in.data(), big_in.size(), tag(2, 0, prev));
  auto sending = ep.send_async(big.data(), big.size(), tag(2, 0, p.rank));
  CHECK(receiving.wait(kTimeout) == big_in.size());
  CHECK(sending.wait(kTimeout) == big.size());
  CHECK(big_in == chunk_of(2, prev, 3 << 20));
  // Out-of-range puts are refused before anything moves.
  CHECK_THROWS_AS(ep.put(mine.data(), 16, peers.remote_key(p.job, next, "buffer"), chunk * p.size - 8, kTimeout),
                  tessera::TransportError);
  // Nobody leaves (deregisters) while a peer may still get from it.
  for (int q = 0; q < p.size; ++q) {
    uint8_t bye = 1;
    peers.endpoint(p.job, q).send(&bye, 1, tag(3, 0, p.rank), kTimeout);
  }
  for (int q = 0; q < p.size; ++q) {
    uint8_t bye = 0;
    ucx_receive(p.context, &bye, 1, tag(3, 0, q), kTimeout);
  }
  // A receive nobody sends to times out with the tag in the message.
  uint8_t none = 0;
  CHECK_THROWS_AS(ucx_receive(p.context, &none, 1, tag(9, 9, 9), std::chrono::milliseconds(200)), tessera::TimeoutError);
}

// Two jobs: TESSERA_JOB=train (sources) and TESSERA_PEER_JOB=rollout (targets), or the reverse.
// Every source rank puts its chunk into every target rank's NaN-filled buffer at offset
// rank*chunk, flushes and says done; targets check bitwise and answer; sources then get back a
// target's whole buffer and check it too.
TEST_CASE("two separately launched jobs meet through a shared store namespace", "[.crossjob]") {
  Process p;
  const std::string peer_job = env_str("TESSERA_PEER_JOB", "");
  REQUIRE(!peer_job.empty());
  const bool source = env_str("TESSERA_UCX_ROLE", "source") == "source";
  UcxPeers peers(p.context, p.store, p.job, p.rank, p.size, "crossjob");
  const int peer_size = peers.connect(peer_job);
  INFO("job " << p.job << " rank " << p.rank << " of " << p.size << "; peer job " << peer_job << " of " << peer_size);
  const size_t chunk = (1 << 20) + 7;
  if (source) {
    auto mine = chunk_of(1, p.rank, chunk);
    for (int q = 0; q < peer_size; ++q) {
      auto& ep = peers.endpoint(peer_job, q);
      ep.put(mine.data(), chunk, peers.remote_key(peer_job, q, "weights"), p.rank * chunk, kTimeout);
      ep.flush(kTimeout);
      uint32_t done = p.rank;
      ep.send(&done, sizeof done, tag(1, 1, p.rank), kTimeout);
    }
    for (int q = 0; q < peer_size; ++q) {
      uint64_t answer = 0;
      ucx_receive(p.context, &answer, sizeof answer, tag(2, 2, q), kTimeout);
      CHECK(answer == 0x600D0000u + q);
    }
    // Read back the whole buffer of target (rank % peer_size) with a get.
    const int q = p.rank % peer_size;
    std::vector<uint8_t> back(chunk * p.size);
    auto& ep = peers.endpoint(peer_job, q);
    ep.get(back.data(), back.size(), peers.remote_key(peer_job, q, "weights"), 0, kTimeout);
    for (int r = 0; r < p.size; ++r) CHECK(std::memcmp(back.data() + r * chunk, chunk_of(1, r, chunk).data(), chunk) == 0);
    for (int t = 0; t < peer_size; ++t) {
      uint8_t bye = 1;
      peers.endpoint(peer_job, t).send(&bye, 1, tag(3, 1, p.rank), kTimeout);
    }
  } else {
    std::vector<float> nan_fill((chunk * peer_size + 3) / 4, std::numeric_limits<float>::quiet_NaN());
    auto* buffer = reinterpret_cast<uint8_t*>(nan_fill.data());
    UcxMemory memory(p.context, buffer, chunk * peer_size);
    peers.publish_memory("weights", memory);
    for (int s = 0; s < peer_size; ++s) {
      uint32_t done = 99;
      ucx_receive(p.context, &done, sizeof done, tag(1, 1, s), kTimeout);
      CHECK(done == static_cast<uint32_t>(s));
    }
    bool all_equal = true;
    for (int s = 0; s < peer_size; ++s)
      all_equal &= std::memcmp(buffer + s * chunk, chunk_of(1, s, chunk).data(), chunk) == 0;
    CHECK(all_equal);
    for (int s = 0; s < peer_size; ++s) {
      uint64_t answer = all_equal ? 0x600D0000u + p.rank : 0xBAD;
      peers.endpoint(peer_job, s).send(&answer, sizeof answer, tag(2, 2, p.rank), kTimeout);
    }
    // Keep the buffer registered (and the worker progressing) until every source is done.
    for (int s = 0; s < peer_size; ++s) {
      uint8_t bye = 0;
      ucx_receive(p.context, &bye, 1, tag(3, 1, s), kTimeout);
    }
  }
}
