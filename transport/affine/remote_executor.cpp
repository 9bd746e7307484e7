#include "transport/affine/remote_executor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <sstream>

#include "core/affine/errors.h"
#include "core/affine/local_executor.h"
#include "core/error.h"
#include "transport/affine/streaming_copy.h"
#include "transport/affine/transfer_digests.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_endpoint.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

namespace tessera::transport {
namespace {

using affine::Plan;
using affine::Segment;

constexpr uint64_t kDoneTag = uint64_t{0xAF} << 56;

std::string name_of(const ProcessId& p) { return "job '" + p.job + "' rank " + std::to_string(p.rank); }

// Calls f(source_address, target_address, elements, source_step) for every run of a segment: a
// run is a whole innermost row when that axis is contiguous at the target (source_step is the
// source stride along it: 1 = contiguous at both ends), a single element otherwise.
template <class F>
void for_each_run(const Segment& s, F&& f) {
  const int nd = s.shape.size();
  if (s.elements() == 0) return;
  if (nd == 0) return f(s.source_offset, s.target_offset, int64_t{1}, int64_t{1});
  const int inner = nd - 1;
  const bool rows = s.target_strides[inner] == 1;
  const int outer_axes = rows ? inner : nd;
  const int64_t run = rows ? s.shape[inner] : 1;
  const int64_t step = rows ? s.source_strides[inner] : 1;
  std::vector<int64_t> index(outer_axes, 0);
  for (;;) {
    int64_t src = s.source_offset, dst = s.target_offset;
    for (int k = 0; k < outer_axes; ++k) {
      src += index[k] * s.source_strides[k];
      dst += index[k] * s.target_strides[k];
    }
    f(src, dst, run, step);
    int k = outer_axes - 1;
    while (k >= 0 && ++index[k] == s.shape[k]) index[k--] = 0;
    if (k < 0) return;
  }
}

// Whether the segment's target is one dense row-major block (its runs land back to back), so its
// rows can be packed at the source and sent as one put per staging chunk.
bool dense_target(const Segment& s) {
  int64_t expected = 1;
  for (int k = s.shape.size() - 1; k >= 0; --k) {
    if (s.shape[k] != 1 && s.target_strides[k] != expected) return false;
    expected *= s.shape[k];
  }
  return true;
}

// Copies n elements of es bytes, `step` elements apart at the source, to consecutive ones; a
// contiguous run with streaming stores when `streaming` (streaming_copy.h).
void gather_elements(char* dst, const char* src, int64_t n, int64_t step, int64_t es, bool streaming = false) {
  if (step == 1 && streaming) return streaming_copy(dst, src, static_cast<size_t>(n * es));
  if (step == 1) return void(std::memcpy(dst, src, static_cast<size_t>(n * es)));
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * es, src + i * step * es, static_cast<size_t>(es));
}

// The store key under which a target process publishes its MemoryTable in an epoch.
std::string memory_key(const ProcessId& p) { return "memory/" + p.job + "/" + std::to_string(p.rank); }

// A target process's buffers as published for one epoch: the descriptors of its registrations
// (UcxMemory::descriptor(), usually one: a rollout rank's weight region) and, per (transfer, plan
// rank) it holds, the buffer's offset inside its registration. Little-endian u64 fields.
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

}  // namespace

// Unpacked once per (process, registration) and kept: on one machine unpacking a shared-memory
// key attaches the target's segment (shmat), and every page the next puts touch through a fresh
// attach faults again. Re-unpacking at every sync cost 80k page faults per 327 MB and 70-160 ms of
// store round trips (bench/sync, perf).
const UcxRemoteKey& RemoteExecutor::remote_key(const ProcessId& target, UcxEndpoint& endpoint,
                                               const std::vector<uint8_t>& descriptor, uint64_t epoch) {
  auto& cached = remote_keys_[{target, descriptor}];
  if (!cached.rkey) cached.rkey = std::make_shared<UcxRemoteKey>(endpoint, descriptor);
  cached.last_epoch = epoch;
  return *cached.rkey;
}

// A registration no batch has named since `epoch` is dropped (its target may have freed it).
void RemoteExecutor::forget_remote_keys_before(uint64_t epoch) {
  for (auto it = remote_keys_.begin(); it != remote_keys_.end();)
    it = it->second.last_epoch < epoch ? remote_keys_.erase(it) : std::next(it);
}

RemoteExecutor::RemoteExecutor(UcxPeers& peers, std::string session, const RemoteExecutorOptions& options)
    : peers_(peers), session_(std::move(session)), options_(options) {}

RemoteExecutor::~RemoteExecutor() = default;

void RemoteExecutor::use_registered(std::shared_ptr<UcxMemory> memory) {
  if (memory && memory->bytes()) registrations_[reinterpret_cast<uintptr_t>(memory->address())] = std::move(memory);
}

RemoteTransferStats RemoteExecutor::execute(const std::vector<RemoteTransfer>& batch, const std::function<void()>& agreed) {
  RemoteTransferStats stats;
  const ProcessId me{peers_.job(), peers_.rank()};
  const uint64_t epoch = ++epoch_;
  const std::string head = "remote transfer '" + session_ + "' #" + std::to_string(epoch);

  // Who takes part, in one order every process agrees on.
  std::set<ProcessId> everyone, sources, targets;
  for (const auto& t : batch) {
    for (const auto& p : t.source_processes) everyone.insert(p), sources.insert(p);
    for (const auto& p : t.target_processes) everyone.insert(p), targets.insert(p);
  }
  if (!everyone.count(me)) return stats;
  const std::vector<ProcessId> order(everyone.begin(), everyone.end());
  auto index_of = [&](const ProcessId& p) {
    return static_cast<uint64_t>(std::lower_bound(order.begin(), order.end(), p) - order.begin());
  };

  // 1. Local validation (nothing leaves this process yet) and the digest of the batch.
  std::string reject;
  Fnv digest;
  TransferDigests transfer_digests;
  int64_t outgoing = 0;  // bytes this process puts to other processes
  digest.str(session_);
  digest.u64(epoch);
  digest.u64(batch.size());
  for (size_t ti = 0; ti < batch.size() && reject.empty(); ++ti) {
    const auto& t = batch[ti];
    if (!t.plan) {
      reject = "transfer " + std::to_string(ti) + " has no plan";
      break;
    }
    const Plan& plan = *t.plan;
    Fnv transfer_digest;  // kept per transfer, to name the tensor when the batch digests differ
    transfer_digest.u64(plan.digest());
    transfer_digest.u64(plan.input_digest);
    for (const auto* side : {&t.source_processes, &t.target_processes}) {
      transfer_digest.u64(side->size());
      for (const auto& p : *side) transfer_digest.str(p.job), transfer_digest.u64(static_cast<uint64_t>(p.rank));
    }
    digest.u64(transfer_digest.h);
    transfer_digests.emplace_back(plan.name, transfer_digest.h);
    const int64_t es = affine::element_size(plan.dtype);
    // Placement only: the buffers themselves are checked by affine::validate_local_batch below.
    auto check = [&](const char* role, int rank, const std::vector<ProcessId>& placement,
                     const std::map<int, affine::LocalBuffer>& buffers) {
      if (!reject.empty()) return;
      if (rank < 0 || rank >= static_cast<int>(placement.size())) {
        reject = "tensor '" + plan.name + "': " + role + " rank " + std::to_string(rank) + " is placed on no process";
      } else if (placement[rank] == me && !buffers.count(rank)) {
        reject = "tensor '" + plan.name + "': no " + role + " buffer for plan rank " + std::to_string(rank);
      }
    };
    for (const auto& s : plan.segments) {
      if (s.elements() == 0) continue;
      check("source", s.source_rank, t.source_processes, t.source_buffers);
      check("target", s.target_rank, t.target_processes, t.target_buffers);
      if (!reject.empty()) continue;
      const bool to_me = t.target_processes[s.target_rank] == me;  // placements checked just above
      if (to_me) stats.useful_bytes += s.elements() * es;
      if (!to_me && t.source_processes[s.source_rank] == me) outgoing += s.elements() * es;
    }
  }

  // The buffers this process holds: dtypes, extents, targets written twice (aliasing buffers
  // included) and sources aliasing targets, with the local executor's own checks.
  if (reject.empty()) {
    std::vector<affine::LocalTransfer> held;
    for (const auto& t : batch) held.push_back({t.plan, t.source_buffers, t.target_buffers});
    affine::LocalExecutorOptions check_options;
    check_options.staging_bytes = options_.staging_bytes;
    check_options.only_held_buffers = true;
    try {
      affine::validate_local_batch(held, check_options);
    } catch (const Error& e) {
      reject = std::string("its buffers: ") + e.what();
    }
  }

  // Register this process's target buffers and publish their keys (before voting: one round).
  auto store = peers_.store()->scoped("remote/" + session_ + "/" + std::to_string(epoch));
  std::vector<std::string> published;  // this process's memory keys of this epoch
  if (reject.empty()) {
    try {
      // One table for all of this process's target buffers (one store key, read once by each
      // source process): every distinct registration's descriptor once, then per (transfer,
      // plan rank) its buffer's offset inside it and the descriptor's index.
      MemoryTable table;
      std::map<const UcxMemory*, uint64_t> descriptor_index;
      for (size_t ti = 0; ti < batch.size(); ++ti) {
        for (const auto& [rank, buffer] : batch[ti].target_buffers) {
          const size_t bytes = static_cast<size_t>(buffer.elements * affine::element_size(buffer.dtype));
          const auto address = reinterpret_cast<uintptr_t>(buffer.data);
          // The registration containing [address, address + bytes), if any.
          std::shared_ptr<UcxMemory> memory;
          auto it = registrations_.upper_bound(address);
          if (it != registrations_.begin()) {
            --it;
            const auto base = reinterpret_cast<uintptr_t>(it->second->address());
            if (address >= base && address + bytes <= base + it->second->bytes()) memory = it->second;
          }
          if (!memory) {
            memory = std::make_shared<UcxMemory>(peers_.context(), buffer.data, bytes);
            registrations_[address] = memory;
          }
          auto [d, fresh] = descriptor_index.emplace(memory.get(), table.descriptors.size());
          if (fresh) table.descriptors.push_back(memory->descriptor());
          table.entries[{ti, rank}] = {address - reinterpret_cast<uintptr_t>(memory->address()), d->second};
        }
      }
      if (!table.entries.empty()) {
        published.push_back(memory_key(me));
        store->set(published.back(), table.encode());
      }
    } catch (const std::exception& e) {
      reject = std::string("registering target buffers failed: ") + e.what();
    }
  }

  // 2. Agreement: everyone's (digest, reject) before any byte moves.
  {
    std::ostringstream vote;
    vote << std::hex << digest.h << std::dec << " " << (reject.empty() ? 0 : 1) << " " << reject;
    store->set("vote/" + me.job + "/" + std::to_string(me.rank), vote.str());
    std::string first_reject, mismatch;
    uint64_t first_digest = 0;
    size_t differing = 0;  // the first process whose digest differs from order[0]'s
    for (size_t i = 0; i < order.size(); ++i) {
      auto text = store->get_string("vote/" + order[i].job + "/" + std::to_string(order[i].rank), options_.timeout);
      std::istringstream in(text);
      uint64_t d = 0;
      int rejected = 0;
      in >> std::hex >> d >> std::dec >> rejected;
      std::string reason;
      std::getline(in, reason);
      if (rejected && first_reject.empty()) first_reject = name_of(order[i]) + " refused:" + reason;
      if (i == 0) first_digest = d;
      else if (d != first_digest && mismatch.empty()) {
        std::ostringstream m;
        m << "the processes planned different batches: " << name_of(order[0]) << " has digest " << std::hex
          << first_digest << ", " << name_of(order[i]) << " has " << d;
        mismatch = m.str();
        differing = i;
      }
    }
    if (first_reject.empty() && !mismatch.empty()) {
      // Every process read the same votes, so every one takes this path: each publishes its
      // per-tensor digests and compares the two processes the message names (only on failure).
      const std::string key = "transfers/" + me.job + "/" + std::to_string(me.rank);
      published.push_back(key);
      published_ = published;  // the next epoch removes them
      try {
        store->set(key, encode_transfer_digests(transfer_digests));
        mismatch += "; " + first_differing_transfer(
                               decode_transfer_digests(store->get_string(
                                   "transfers/" + order[0].job + "/" + std::to_string(order[0].rank), options_.timeout)),
                               decode_transfer_digests(store->get_string("transfers/" + order[differing].job + "/" +
                                                                             std::to_string(order[differing].rank),
                                                                         options_.timeout)));
      } catch (const std::exception& e) {
        mismatch += std::string("; the per-tensor digests could not be compared: ") + e.what();
      }
    }
    if (!first_reject.empty() || !mismatch.empty())
      throw affine::TransferRefusedError(head + " refused on every process, no byte moved: " +
                                         (first_reject.empty() ? mismatch : first_reject));
  }
  if (agreed) agreed();

  // Everyone voted in this epoch, so everyone finished epoch - 1 (and read its keys): this
  // process's keys of epoch - 1 can go, keeping the store from growing with every sync.
  if (epoch > 1) {
    try {
      auto old_store = peers_.store()->scoped("remote/" + session_ + "/" + std::to_string(epoch - 1));
      old_store->remove("vote/" + me.job + "/" + std::to_string(me.rank));
      for (const auto& name : published_) old_store->remove(name);
    } catch (const TransportError&) {
      // Leftover keys are harmless.
    }
  }
  published_ = published;

  // Connect to every job involved (idempotent).
  std::set<std::string> jobs;
  for (const auto& p : order) jobs.insert(p.job);
  for (const auto& job : jobs) peers_.connect(job);

  // 4 (posted early). Receives of the "done" messages of every other source process.
  const bool i_am_target = targets.count(me) > 0;
  std::vector<uint64_t> done_bytes(order.size(), 0);
  std::vector<UcxRequest> done_receives;
  if (i_am_target)
    for (const auto& p : sources)
      if (!(p == me))
        done_receives.push_back(ucx_receive_async(peers_.context(), &done_bytes[index_of(p)], sizeof(uint64_t),
                                                  kDoneTag | ((epoch & 0xffffff) << 24) | index_of(p)));

  // 3. Data movement from this process's sources.
  std::map<ProcessId, uint64_t> sent_to;
  // Target tables by process (read once in this epoch) and the remote keys they name.
  std::map<ProcessId, MemoryTable> tables;
  struct TargetKey {
    uint64_t offset = 0;  // of the target buffer inside its registration
    const UcxRemoteKey* rkey = nullptr;
    char* mapped = nullptr;  // the target buffer in this process, when UCX maps it here
  };
  std::map<std::pair<size_t, int>, TargetKey> keys;
  std::set<UcxEndpoint*> round_endpoints;
  int64_t in_flight = 0;
  int64_t copied_into_me = 0;
  std::vector<char>& staging = staging_;  // reusable after a flush
  int64_t staging_used = 0;
  bool staging_pending = false;  // a put from staging has not completed locally yet
  // Every put so far complete at its target; the staging bytes stay where they are (the caller
  // may have packed the next put there already).
  auto flush_round = [&] {
    for (auto* ep : round_endpoints) ep->flush(options_.timeout);
    round_endpoints.clear();
    if (in_flight > 0) ++stats.rounds;
    in_flight = 0;
    staging_pending = false;
  };
  auto end_round = [&] {
    flush_round();
    stats.staging_peak_bytes = std::max(stats.staging_peak_bytes, staging_used);
    staging_used = 0;
  };
  // A round holds at most staging_bytes (a single larger put is a round of its own).
  auto make_room = [&](int64_t bytes) {
    if (in_flight > 0 && in_flight + bytes > options_.staging_bytes) flush_round();
  };
  // Whether copies into mapped targets stream past the caches (a last-level cache holds tens of
  // MiB; the sync of a small model stays cached).
  const bool streaming = outgoing > options_.streaming_copy_bytes;
  for (size_t ti = 0; ti < batch.size(); ++ti) {
    const auto& t = batch[ti];
    const Plan& plan = *t.plan;
    const int64_t es = affine::element_size(plan.dtype);
    for (const auto& s : plan.segments) {
      if (s.elements() == 0 || !(t.source_processes[s.source_rank] == me)) continue;
      ++stats.segments;
      const auto& target = t.target_processes[s.target_rank];
      auto* src_base = static_cast<const char*>(t.source_buffers.at(s.source_rank).data);
      if (target == me) {
        auto* dst_base = static_cast<char*>(t.target_buffers.at(s.target_rank).data);
        for_each_run(s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
          gather_elements(dst_base + dst * es, src_base + src * es, n, step, es);
        });
        stats.bytes_copied_locally += s.elements() * es;
        copied_into_me += s.elements() * es;
        continue;
      }
      auto& ep = peers_.endpoint(target.job, target.rank);
      auto& key = keys[{ti, s.target_rank}];
      if (!key.rkey) {
        auto table = tables.find(target);
        if (table == tables.end())
          table = tables.emplace(target, MemoryTable::decode(store->get(memory_key(target), options_.timeout),
                                                             "target buffers of " + name_of(target))).first;
        auto entry = table->second.entries.find({ti, s.target_rank});
        if (entry == table->second.entries.end())
          throw TransportError(head + ": " + name_of(target) + " published no buffer for tensor '" + plan.name +
                               "' plan rank " + std::to_string(s.target_rank));
        key.offset = entry->second.offset;
        key.rkey = &remote_key(target, ep, table->second.descriptors.at(entry->second.descriptor), epoch);
        key.mapped = static_cast<char*>(key.rkey->mapped(static_cast<size_t>(key.offset)));
      }
      const bool one_run = s.shape.size() == 1 && s.source_strides[0] == 1 && s.target_strides[0] == 1;
      if (key.mapped && (!one_run || streaming)) {
        // The target buffer is mapped here (a peer's UCX-allocated memory on this machine): rows
        // are copied straight into it, one pass over memory like a local copy, instead of being
        // packed into staging and put from there (packing 64 MiB of row-parallel shards took
        // 12-21 ms and the puts from staging 7-11 ms more, bench/sync, where the whole-run puts
        // moved 5-8 GiB/s). Whole contiguous runs stay one UCX put each (a memcpy into the same
        // mapping) unless the batch streams, when they are streaming copies too. The fences before
        // the "done" message make these bytes visible to the target.
        for_each_run(s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
          gather_elements(key.mapped + dst * es, src_base + src * es, n, step, es, streaming);
        });
        const int64_t bytes = s.elements() * es;
        stats.bytes_sent += bytes, stats.bytes_mapped += bytes;
        sent_to[target] += static_cast<uint64_t>(bytes);
        continue;
      }
      if (s.shape.size() > 1 && dense_target(s)) {
        // Coalesced: the segment's rows are packed back to back into staging and each chunk of
        // kStagingChunkBytes goes as one put (a row-parallel shard: thousands of short rows, a few
        // messages). A put that completed in place (into a peer's shared memory) has copied its
        // chunk out already, so while no put from staging is pending the next chunk is packed
        // where that one was: staging stays in cache and the segment costs one pass over memory,
        // as a memcpy does (packing a whole 3 MiB shard out to memory and reading it back for the
        // put cost a second pass).
        if (staging.empty()) staging.resize(static_cast<size_t>(std::max<int64_t>(options_.staging_bytes, es)));
        const int64_t capacity = static_cast<int64_t>(staging.size()) / es * es;
        const int64_t chunk_limit = std::max<int64_t>(es, std::min<int64_t>(capacity, kStagingChunkBytes) / es * es);
        int64_t chunk_dst = 0, chunk_bytes = 0;
        const char* chunk_start = nullptr;
        auto put_chunk = [&] {
          if (chunk_bytes == 0) return;
          make_room(chunk_bytes);
          if (!ep.put_nowait(chunk_start, static_cast<size_t>(chunk_bytes), *key.rkey,
                             static_cast<size_t>(key.offset + chunk_dst * es), options_.timeout))
            staging_pending = true;
          ++stats.puts;
          stats.bytes_sent += chunk_bytes;
          sent_to[target] += static_cast<uint64_t>(chunk_bytes);
          in_flight += chunk_bytes;
          round_endpoints.insert(&ep);
          chunk_bytes = 0;
          stats.staging_peak_bytes = std::max(stats.staging_peak_bytes, staging_used);
          if (!staging_pending) staging_used = 0;
          if (in_flight >= options_.staging_bytes) end_round();
        };
        for_each_run(s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
          int64_t done = 0;
          while (done < n) {
            if (staging_used >= capacity) {
              put_chunk();
              if (staging_used >= capacity) end_round();  // staging is reused only after its puts completed
            }
            if (chunk_bytes == 0) chunk_start = staging.data() + staging_used, chunk_dst = dst + done;
            const int64_t count =
                std::min({n - done, (capacity - staging_used) / es, (chunk_limit - chunk_bytes) / es});
            gather_elements(staging.data() + staging_used, src_base + (src + done * step) * es, count, step, es);
            staging_used += count * es;
            chunk_bytes += count * es;
            stats.bytes_staged += count * es;
            done += count;
            if (chunk_bytes >= chunk_limit) put_chunk();
          }
        });
        put_chunk();
        continue;
      }
      for_each_run(s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
        // A row strided at the source is packed into the staging buffer and put from there;
        // contiguous rows go straight from the source buffer (no staging copy).
        int64_t done = 0;
        while (done < n) {
          int64_t count = n - done;
          const char* from = src_base + (src + done * step) * es;
          if (step != 1) {
            if (staging.empty()) staging.resize(static_cast<size_t>(std::max<int64_t>(options_.staging_bytes, es)));
            count = std::min<int64_t>(count, static_cast<int64_t>(staging.size()) / es);
            if (staging_used + count * es > static_cast<int64_t>(staging.size())) end_round();
            char* packed = staging.data() + staging_used;
            gather_elements(packed, from, count, step, es);
            staging_used += count * es;
            stats.bytes_staged += count * es;
            from = packed;
          }
          const int64_t bytes = count * es;
          make_room(bytes);
          const bool in_place = ep.put_nowait(from, static_cast<size_t>(bytes), *key.rkey,
                                              static_cast<size_t>(key.offset + (dst + done) * es), options_.timeout);
          if (step != 1 && !in_place) staging_pending = true;  // its packed bytes stay until the flush
          ++stats.puts;
          stats.bytes_sent += bytes;
          sent_to[target] += static_cast<uint64_t>(bytes);
          in_flight += bytes;
          round_endpoints.insert(&ep);
          if (in_flight >= options_.staging_bytes) end_round();
          done += count;
        }
      });
    }
  }
  end_round();

  // 4. Tell every target process what arrived from here; wait for every source.
  if (streaming) streaming_fence();                     // streaming stores are weakly ordered
  std::atomic_thread_fence(std::memory_order_seq_cst);  // bytes copied into mapped targets first
  if (sources.count(me)) {
    std::vector<uint64_t> payloads;
    payloads.reserve(targets.size());
    std::vector<UcxRequest> sends;
    for (const auto& p : targets) {
      if (p == me) continue;
      payloads.push_back(sent_to[p]);
      sends.push_back(peers_.endpoint(p.job, p.rank)
                          .send_async(&payloads.back(), sizeof(uint64_t),
                                      kDoneTag | ((epoch & 0xffffff) << 24) | index_of(me)));
    }
    for (auto& r : sends) r.wait(options_.timeout);
  }
  for (auto& r : done_receives) r.wait(options_.timeout);
  forget_remote_keys_before(epoch - 1);
  for (auto b : done_bytes) stats.bytes_received += static_cast<int64_t>(b);
  if (stats.useful_bytes > 0)
    stats.wire_to_useful = static_cast<double>(stats.bytes_received + copied_into_me) / stats.useful_bytes;
  return stats;
}

}  // namespace tessera::transport
