// What a target process of a remote transfer publishes in the store for one epoch
// (remote_executor.h, step 3): the descriptors of its registrations (UcxMemory::descriptor(),
// usually one: a rollout rank's weight region) and, per (transfer, plan rank) it holds, the
// buffer's offset inside its registration. Little-endian u64 fields. Used by remote_executor.cpp
// only; a header of its own to keep that file short.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "transport/affine/remote_executor.h"

namespace tessera::transport {

// The store key under which a target process publishes its MemoryTable in an epoch.
inline std::string memory_key(const ProcessId& p) { return "memory/" + p.job + "/" + std::to_string(p.rank); }

struct MemoryTable {
  struct Entry {
    uint64_t offset = 0;
    uint64_t descriptor = 0;  // index into descriptors
  };
  std::vector<std::vector<uint8_t>> descriptors;
  std::map<std::pair<size_t, int>, Entry> entries;

  std::vector<uint8_t> encode() const {
    std::vector<uint8_t> out;
    auto u64 = [&](uint64_t v) {
      const auto* b = reinterpret_cast<const uint8_t*>(&v);
      out.insert(out.end(), b, b + 8);
    };
    u64(descriptors.size());
    for (const auto& d : descriptors) u64(d.size()), out.insert(out.end(), d.begin(), d.end());
    u64(entries.size());
    for (const auto& [at, e] : entries) u64(at.first), u64(static_cast<uint64_t>(at.second)), u64(e.offset), u64(e.descriptor);
    return out;
  }
  static MemoryTable decode(const std::vector<uint8_t>& in, const std::string& what) {
    MemoryTable t;
    size_t at = 0;
    auto u64 = [&] {
      if (in.size() - at < 8) throw TransportError("UCX " + what + ": the published table is truncated");
      uint64_t v = 0;
      std::memcpy(&v, in.data() + at, 8);
      at += 8;
      return v;
    };
    for (uint64_t n = u64(); n > 0; --n) {
      const uint64_t size = u64();
      if (in.size() - at < size) throw TransportError("UCX " + what + ": the published table is truncated");
      t.descriptors.emplace_back(in.begin() + at, in.begin() + at + size);
      at += size;
    }
    for (uint64_t n = u64(); n > 0; --n) {
      const uint64_t ti = u64(), rank = u64(), offset = u64(), d = u64();
      if (d >= t.descriptors.size()) throw TransportError("UCX " + what + ": an entry names descriptor " + std::to_string(d) +
                                                          " of " + std::to_string(t.descriptors.size()));
      t.entries[{size_t(ti), int(rank)}] = {offset, d};
    }
    return t;
  }
};

}  // namespace tessera::transport
