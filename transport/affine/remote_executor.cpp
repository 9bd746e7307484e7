#include "transport/affine/remote_executor.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <sstream>

#include "core/affine/errors.h"
#include "core/affine/local_executor.h"
#include "core/error.h"
#include "transport/affine/memory_table.h"
#include "transport/affine/segment_runs.h"
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

// A target buffer as this process reaches it.
struct TargetKey {
  uint64_t offset = 0;  // of the target buffer inside its registration
  const UcxRemoteKey* rkey = nullptr;
  char* mapped = nullptr;  // the target buffer in this process, when UCX maps it here
};

// One segment this process moves into another process's target buffer.
struct Outgoing {
  const Segment& s;
  int64_t es;       // element size
  const char* src;  // the source buffer
  const ProcessId& target;
  UcxEndpoint& ep;
  const TargetKey& key;
};

// What the votes of one epoch say, read alike by every process.
struct Votes {
  std::string first_reject, mismatch;
  size_t differing = 0;  // the first process whose digest differs from order[0]'s
};

}  // namespace

// The state of one execute() call, shared by its phases (remote_executor.h numbers them). A
// nested class, so the phases reach the executor's registrations, key cache and staging buffer.
struct RemoteExecutor::Call {
  Call(RemoteExecutor& executor, const std::vector<RemoteTransfer>& batch);

  RemoteExecutor& ex;
  const std::vector<RemoteTransfer>& batch;
  const RemoteExecutorOptions& options;
  const ProcessId me;
  const uint64_t epoch;
  const std::string head;  // names the call in errors
  std::set<ProcessId> sources, targets;
  std::vector<ProcessId> order;  // everyone taking part, in one order every process agrees on
  RemoteTransferStats stats;

  // 1. Validate.
  std::string reject;  // empty while this process accepts the batch
  Fnv digest;
  TransferDigests transfer_digests;
  int64_t outgoing = 0;  // bytes this process puts to other processes
  std::shared_ptr<Store> store;  // this epoch's keys
  std::vector<std::string> published;  // this process's memory keys of this epoch

  // 3. Move (done_* belong to phase 4; posted before the first put).
  std::vector<uint64_t> done_bytes;
  std::vector<UcxRequest> done_receives;
  bool streaming = false;  // copies into mapped targets stream past the caches
  std::map<ProcessId, uint64_t> sent_to;
  std::map<ProcessId, MemoryTable> tables;  // by target process, read once in this epoch
  std::map<std::pair<size_t, int>, TargetKey> keys;  // by (transfer, target plan rank)
  std::set<UcxEndpoint*> round_endpoints;
  int64_t in_flight = 0;
  int64_t copied_into_me = 0;
  int64_t staging_used = 0;
  bool staging_pending = false;  // a put from staging has not completed locally yet

  bool takes_part() const { return !order.empty(); }
  uint64_t index_of(const ProcessId& p) const {
    return static_cast<uint64_t>(std::lower_bound(order.begin(), order.end(), p) - order.begin());
  }
  uint64_t done_tag(uint64_t sender) const { return kDoneTag | ((epoch & 0xffffff) << 24) | sender; }

  void validate();
  void validate_placements();
  void validate_buffers();
  void publish_targets();
  std::shared_ptr<UcxMemory> registration_of(const affine::LocalBuffer& buffer);

  void agree(const TransferHooks& hooks);
  Votes read_votes();
  void commit(const TransferHooks& hooks);
  void withdraw(const TransferHooks& hooks) noexcept;
  std::string compare_transfers(size_t differing);
  void drop_previous_epoch();

  void move();
  void post_done_receives();
  void move_segment(size_t ti, const Segment& s);
  const TargetKey& target_key(size_t ti, const Segment& s, const ProcessId& target, UcxEndpoint& ep);
  void copy_mapped(const Outgoing& o);
  void put_packed(const Outgoing& o);
  void put_rows(const Outgoing& o);
  bool put(const Outgoing& o, const char* from, int64_t bytes, int64_t dst);
  std::vector<char>& staging(int64_t es);
  void flush_round();
  void end_round();
  void make_room(int64_t bytes);

  RemoteTransferStats finish();
};

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

RemoteTransferStats RemoteExecutor::execute(const std::vector<RemoteTransfer>& batch, const TransferHooks& hooks) {
  Call call(*this, batch);
  if (!call.takes_part()) return call.stats;
  call.validate();
  call.agree(hooks);
  call.move();
  return call.finish();
}

// Every call takes an epoch, even one this process is not part of: the epochs stay in step.
RemoteExecutor::Call::Call(RemoteExecutor& executor, const std::vector<RemoteTransfer>& batch)
    : ex(executor),
      batch(batch),
      options(executor.options_),
      me{executor.peers_.job(), executor.peers_.rank()},
      epoch(++executor.epoch_),
      head("remote transfer '" + executor.session_ + "' #" + std::to_string(epoch)) {
  std::set<ProcessId> everyone;
  for (const auto& t : batch) {
    for (const auto& p : t.source_processes) everyone.insert(p), sources.insert(p);
    for (const auto& p : t.target_processes) everyone.insert(p), targets.insert(p);
  }
  if (everyone.count(me)) order.assign(everyone.begin(), everyone.end());
}

// ---- 1. Validate ----

// Local validation (nothing leaves this process yet) and the digest of the batch. The target
// buffers are registered and published here, before the vote: one store round, and a failure to
// register is a reject like any other.
void RemoteExecutor::Call::validate() {
  validate_placements();
  if (reject.empty()) validate_buffers();
  store = ex.peers_.store()->scoped("remote/" + ex.session_ + "/" + std::to_string(epoch));
  if (reject.empty()) publish_targets();
}

// Every plan rank is placed and this process holds the buffers placed on it; the batch digest
// and per-transfer digests, useful_bytes and outgoing come out of the same pass.
void RemoteExecutor::Call::validate_placements() {
  digest.str(ex.session_);
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
    // Placement only: the buffers themselves are checked by validate_buffers.
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
}

// The buffers this process holds: dtypes, extents, targets written twice (aliasing buffers
// included) and sources aliasing targets, with the local executor's own checks.
void RemoteExecutor::Call::validate_buffers() {
  std::vector<affine::LocalTransfer> held;
  for (const auto& t : batch) held.push_back({t.plan, t.source_buffers, t.target_buffers});
  affine::LocalExecutorOptions check_options;
  check_options.staging_bytes = options.staging_bytes;
  check_options.only_held_buffers = true;
  try {
    affine::validate_local_batch(held, check_options);
  } catch (const Error& e) {
    reject = std::string("its buffers: ") + e.what();
  }
}

// One table for all of this process's target buffers (one store key, read once by each source
// process): every distinct registration's descriptor once, then per (transfer, plan rank) its
// buffer's offset inside it and the descriptor's index.
void RemoteExecutor::Call::publish_targets() {
  try {
    MemoryTable table;
    std::map<const UcxMemory*, uint64_t> descriptor_index;
    for (size_t ti = 0; ti < batch.size(); ++ti) {
      for (const auto& [rank, buffer] : batch[ti].target_buffers) {
        const auto memory = registration_of(buffer);
        auto [d, fresh] = descriptor_index.emplace(memory.get(), table.descriptors.size());
        if (fresh) table.descriptors.push_back(memory->descriptor());
        table.entries[{ti, rank}] = {
            reinterpret_cast<uintptr_t>(buffer.data) - reinterpret_cast<uintptr_t>(memory->address()), d->second};
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

// The registration containing the buffer (registered now if none does).
std::shared_ptr<UcxMemory> RemoteExecutor::Call::registration_of(const affine::LocalBuffer& buffer) {
  const size_t bytes = static_cast<size_t>(buffer.elements * affine::element_size(buffer.dtype));
  const auto address = reinterpret_cast<uintptr_t>(buffer.data);
  auto it = ex.registrations_.upper_bound(address);
  if (it != ex.registrations_.begin()) {
    --it;
    const auto base = reinterpret_cast<uintptr_t>(it->second->address());
    if (address >= base && address + bytes <= base + it->second->bytes()) return it->second;
  }
  auto memory = std::make_shared<UcxMemory>(ex.peers_.context(), buffer.data, bytes);
  ex.registrations_[address] = memory;
  return memory;
}

// ---- 2. Agree ----

// Everyone's (digest, reject) before any byte moves.
void RemoteExecutor::Call::agree(const TransferHooks& hooks) {
  std::ostringstream vote;
  vote << std::hex << digest.h << std::dec << " " << (reject.empty() ? 0 : 1) << " " << reject;
  const bool accepts = reject.empty();
  if (accepts && hooks.exposed) hooks.exposed();  // peers that read our vote may write from now on
  Votes votes;
  try {
    store->set("vote/" + me.job + "/" + std::to_string(me.rank), vote.str());
    votes = read_votes();
  } catch (...) {
    if (accepts) withdraw(hooks);
    throw;
  }
  // Every process read the same votes, so every one takes this path.
  if (votes.first_reject.empty() && !votes.mismatch.empty())
    votes.mismatch += "; " + compare_transfers(votes.differing);
  if (!votes.first_reject.empty() || !votes.mismatch.empty()) {
    if (accepts && hooks.withdrawn) hooks.withdrawn();
    throw affine::TransferRefusedError(head + " refused on every process, no byte moved: " +
                                       (votes.first_reject.empty() ? votes.mismatch : votes.first_reject));
  }
  commit(hooks);
  drop_previous_epoch();
  ex.published_ = published;
}

// Unanimous votes: this process may move bytes unless one gave up before it committed.
void RemoteExecutor::Call::commit(const TransferHooks& hooks) {
  const int64_t seen = store->add("commit", 1);
  if (seen < kWithdraw) return;
  const int64_t committed_before = seen % kWithdraw - 1;
  if (committed_before == 0 && hooks.withdrawn) hooks.withdrawn();
  // Commits refused like this one are counted too: committed_before is an upper bound.
  throw TransportError(head + ": a process gave up waiting for the votes before this one committed; " +
                       (committed_before == 0 ? std::string("no byte moved")
                                              : "bytes from up to " + std::to_string(committed_before) +
                                                    " process(es) that committed earlier may have arrived"));
}

// This process could not read the votes: it withdraws, and knows whether any process committed
// (and may be writing into it) first. Without the store it cannot know: its targets stay suspect.
void RemoteExecutor::Call::withdraw(const TransferHooks& hooks) noexcept {
  try {
    const int64_t seen = store->add("commit", kWithdraw);
    if (seen % kWithdraw == 0 && hooks.withdrawn) hooks.withdrawn();
  } catch (...) {
  }
}

Votes RemoteExecutor::Call::read_votes() {
  Votes votes;
  uint64_t first_digest = 0;
  for (size_t i = 0; i < order.size(); ++i) {
    auto text = store->get_string("vote/" + order[i].job + "/" + std::to_string(order[i].rank), options.timeout);
    std::istringstream in(text);
    uint64_t d = 0;
    int rejected = 0;
    in >> std::hex >> d >> std::dec >> rejected;
    std::string reason;
    std::getline(in, reason);
    if (rejected && votes.first_reject.empty()) votes.first_reject = name_of(order[i]) + " refused:" + reason;
    if (i == 0) first_digest = d;
    else if (d != first_digest && votes.mismatch.empty()) {
      std::ostringstream m;
      m << "the processes planned different batches: " << name_of(order[0]) << " has digest " << std::hex
        << first_digest << ", " << name_of(order[i]) << " has " << d;
      votes.mismatch = m.str();
      votes.differing = i;
    }
  }
  return votes;
}

// Only when the digests differ: each process publishes its per-tensor digests and compares the
// two processes the message names; the first tensor planned differently, in words.
std::string RemoteExecutor::Call::compare_transfers(size_t differing) {
  const std::string key = "transfers/" + me.job + "/" + std::to_string(me.rank);
  published.push_back(key);
  ex.published_ = published;  // the next epoch removes them
  try {
    store->set(key, encode_transfer_digests(transfer_digests));
    return first_differing_transfer(
        decode_transfer_digests(
            store->get_string("transfers/" + order[0].job + "/" + std::to_string(order[0].rank), options.timeout)),
        decode_transfer_digests(store->get_string(
            "transfers/" + order[differing].job + "/" + std::to_string(order[differing].rank), options.timeout)));
  } catch (const std::exception& e) {
    return std::string("the per-tensor digests could not be compared: ") + e.what();
  }
}

// Everyone voted in this epoch, so everyone finished epoch - 1 (and read its keys): this
// process's keys of epoch - 1 can go, keeping the store from growing with every sync.
void RemoteExecutor::Call::drop_previous_epoch() {
  if (epoch <= 1) return;
  try {
    auto old_store = ex.peers_.store()->scoped("remote/" + ex.session_ + "/" + std::to_string(epoch - 1));
    old_store->remove("vote/" + me.job + "/" + std::to_string(me.rank));
    if (me == order.front()) old_store->remove("commit");
    for (const auto& name : ex.published_) old_store->remove(name);
  } catch (const TransportError&) {
    // Leftover keys are harmless.
  }
}

// ---- 3. Move ----

void RemoteExecutor::Call::move() {
  // Connect to every job involved (idempotent).
  std::set<std::string> jobs;
  for (const auto& p : order) jobs.insert(p.job);
  for (const auto& job : jobs) ex.peers_.connect(job);
  post_done_receives();
  // Whether copies into mapped targets stream past the caches (a last-level cache holds tens of
  // MiB; the sync of a small model stays cached).
  streaming = outgoing > options.streaming_copy_bytes;
  for (size_t ti = 0; ti < batch.size(); ++ti) {
    const auto& t = batch[ti];
    for (const auto& s : t.plan->segments) {
      if (s.elements() == 0 || !(t.source_processes[s.source_rank] == me)) continue;
      ++stats.segments;
      move_segment(ti, s);
    }
  }
  end_round();
}

// Phase 4's receives of the "done" messages of every other source process, posted early.
void RemoteExecutor::Call::post_done_receives() {
  done_bytes.assign(order.size(), 0);
  if (!targets.count(me)) return;
  for (const auto& p : sources)
    if (!(p == me))
      done_receives.push_back(
          ucx_receive_async(ex.peers_.context(), &done_bytes[index_of(p)], sizeof(uint64_t), done_tag(index_of(p))));
}

void RemoteExecutor::Call::move_segment(size_t ti, const Segment& s) {
  const auto& t = batch[ti];
  const int64_t es = affine::element_size(t.plan->dtype);
  const auto& target = t.target_processes[s.target_rank];
  auto* src_base = static_cast<const char*>(t.source_buffers.at(s.source_rank).data);
  if (target == me) {
    auto* dst_base = static_cast<char*>(t.target_buffers.at(s.target_rank).data);
    for_each_run(s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
      gather_elements(dst_base + dst * es, src_base + src * es, n, step, es);
    });
    stats.bytes_copied_locally += s.elements() * es;
    copied_into_me += s.elements() * es;
    return;
  }
  auto& ep = ex.peers_.endpoint(target.job, target.rank);
  const Outgoing o{s, es, src_base, target, ep, target_key(ti, s, target, ep)};
  const bool one_run = s.shape.size() == 1 && s.source_strides[0] == 1 && s.target_strides[0] == 1;
  if (o.key.mapped && (!one_run || streaming)) return copy_mapped(o);
  if (s.shape.size() > 1 && dense_target(s)) return put_packed(o);
  put_rows(o);
}

// The target buffer's offset in its registration and its remote key, resolved once per epoch.
const TargetKey& RemoteExecutor::Call::target_key(size_t ti, const Segment& s, const ProcessId& target,
                                                  UcxEndpoint& ep) {
  auto& key = keys[{ti, s.target_rank}];
  if (key.rkey) return key;
  auto table = tables.find(target);
  if (table == tables.end())
    table = tables.emplace(target, MemoryTable::decode(store->get(memory_key(target), options.timeout),
                                                       "target buffers of " + name_of(target))).first;
  auto entry = table->second.entries.find({ti, s.target_rank});
  if (entry == table->second.entries.end())
    throw TransportError(head + ": " + name_of(target) + " published no buffer for tensor '" + batch[ti].plan->name +
                         "' plan rank " + std::to_string(s.target_rank));
  key.offset = entry->second.offset;
  key.rkey = &ex.remote_key(target, ep, table->second.descriptors.at(entry->second.descriptor), epoch);
  key.mapped = static_cast<char*>(key.rkey->mapped(static_cast<size_t>(key.offset)));
  return key;
}

// The target buffer is mapped here (a peer's UCX-allocated memory on this machine): rows are
// copied straight into it, one pass over memory like a local copy, instead of being packed into
// staging and put from there (packing 64 MiB of row-parallel shards took 12-21 ms and the puts
// from staging 7-11 ms more, bench/sync, where the whole-run puts moved 5-8 GiB/s). Whole
// contiguous runs stay one UCX put each (a memcpy into the same mapping) unless the batch
// streams, when they are streaming copies too. The fences before the "done" message make these
// bytes visible to the target.
void RemoteExecutor::Call::copy_mapped(const Outgoing& o) {
  for_each_run(o.s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
    gather_elements(o.key.mapped + dst * o.es, o.src + src * o.es, n, step, o.es, streaming);
  });
  const int64_t bytes = o.s.elements() * o.es;
  stats.bytes_sent += bytes, stats.bytes_mapped += bytes;
  sent_to[o.target] += static_cast<uint64_t>(bytes);
}

// Coalesced: the segment's rows are packed back to back into staging and each chunk of
// kStagingChunkBytes goes as one put (a row-parallel shard: thousands of short rows, a few
// messages). A put that completed in place (into a peer's shared memory) has copied its chunk out
// already, so while no put from staging is pending the next chunk is packed where that one was:
// staging stays in cache and the segment costs one pass over memory, as a memcpy does (packing a
// whole 3 MiB shard out to memory and reading it back for the put cost a second pass).
void RemoteExecutor::Call::put_packed(const Outgoing& o) {
  const int64_t es = o.es;
  auto& buffer = staging(es);
  const int64_t capacity = static_cast<int64_t>(buffer.size()) / es * es;
  const int64_t chunk_limit = std::max<int64_t>(es, std::min<int64_t>(capacity, kStagingChunkBytes) / es * es);
  int64_t chunk_dst = 0, chunk_bytes = 0;
  const char* chunk_start = nullptr;
  auto put_chunk = [&] {
    if (chunk_bytes == 0) return;
    if (!put(o, chunk_start, chunk_bytes, chunk_dst)) staging_pending = true;
    chunk_bytes = 0;
    stats.staging_peak_bytes = std::max(stats.staging_peak_bytes, staging_used);
    if (!staging_pending) staging_used = 0;
    if (in_flight >= options.staging_bytes) end_round();
  };
  for_each_run(o.s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
    int64_t done = 0;
    while (done < n) {
      if (staging_used >= capacity) {
        put_chunk();
        if (staging_used >= capacity) end_round();  // staging is reused only after its puts completed
      }
      if (chunk_bytes == 0) chunk_start = buffer.data() + staging_used, chunk_dst = dst + done;
      const int64_t count = std::min({n - done, (capacity - staging_used) / es, (chunk_limit - chunk_bytes) / es});
      gather_elements(buffer.data() + staging_used, o.src + (src + done * step) * es, count, step, es);
      staging_used += count * es;
      chunk_bytes += count * es;
      stats.bytes_staged += count * es;
      done += count;
      if (chunk_bytes >= chunk_limit) put_chunk();
    }
  });
  put_chunk();
}

// A row strided at the source is packed into the staging buffer and put from there; contiguous
// rows go straight from the source buffer (no staging copy).
void RemoteExecutor::Call::put_rows(const Outgoing& o) {
  const int64_t es = o.es;
  for_each_run(o.s, [&](int64_t src, int64_t dst, int64_t n, int64_t step) {
    int64_t done = 0;
    while (done < n) {
      int64_t count = n - done;
      const char* from = o.src + (src + done * step) * es;
      if (step != 1) {
        auto& buffer = staging(es);
        count = std::min<int64_t>(count, static_cast<int64_t>(buffer.size()) / es);
        if (staging_used + count * es > static_cast<int64_t>(buffer.size())) end_round();
        char* packed = buffer.data() + staging_used;
        gather_elements(packed, from, count, step, es);
        staging_used += count * es;
        stats.bytes_staged += count * es;
        from = packed;
      }
      const bool in_place = put(o, from, count * es, dst + done);
      if (step != 1 && !in_place) staging_pending = true;  // its packed bytes stay until the flush
      if (in_flight >= options.staging_bytes) end_round();
      done += count;
    }
  });
}

// One put of `bytes` into element `dst` of the target buffer, in the current round; true when it
// completed in place.
bool RemoteExecutor::Call::put(const Outgoing& o, const char* from, int64_t bytes, int64_t dst) {
  make_room(bytes);
  const bool in_place = o.ep.put_nowait(from, static_cast<size_t>(bytes), *o.key.rkey,
                                        static_cast<size_t>(o.key.offset + dst * o.es), options.timeout);
  ++stats.puts;
  stats.bytes_sent += bytes;
  sent_to[o.target] += static_cast<uint64_t>(bytes);
  in_flight += bytes;
  round_endpoints.insert(&o.ep);
  return in_place;
}

// The executor's staging buffer, kept from one batch to the next; reusable after a flush.
std::vector<char>& RemoteExecutor::Call::staging(int64_t es) {
  if (ex.staging_.empty()) ex.staging_.resize(static_cast<size_t>(std::max<int64_t>(options.staging_bytes, es)));
  return ex.staging_;
}

// Every put so far complete at its target; the staging bytes stay where they are (the caller may
// have packed the next put there already).
void RemoteExecutor::Call::flush_round() {
  for (auto* ep : round_endpoints) ep->flush(options.timeout);
  round_endpoints.clear();
  if (in_flight > 0) ++stats.rounds;
  in_flight = 0;
  staging_pending = false;
}

void RemoteExecutor::Call::end_round() {
  flush_round();
  stats.staging_peak_bytes = std::max(stats.staging_peak_bytes, staging_used);
  staging_used = 0;
}

// A round holds at most staging_bytes (a single larger put is a round of its own).
void RemoteExecutor::Call::make_room(int64_t bytes) {
  if (in_flight > 0 && in_flight + bytes > options.staging_bytes) flush_round();
}

// ---- 4. Finish ----

// Tell every target process what arrived from here; wait for every source.
RemoteTransferStats RemoteExecutor::Call::finish() {
  if (streaming) streaming_fence();                     // streaming stores are weakly ordered
  std::atomic_thread_fence(std::memory_order_seq_cst);  // bytes copied into mapped targets first
  if (sources.count(me)) {
    std::vector<uint64_t> payloads;
    payloads.reserve(targets.size());  // sends point into it
    std::vector<UcxRequest> sends;
    for (const auto& p : targets) {
      if (p == me) continue;
      payloads.push_back(sent_to[p]);
      sends.push_back(
          ex.peers_.endpoint(p.job, p.rank).send_async(&payloads.back(), sizeof(uint64_t), done_tag(index_of(me))));
    }
    for (auto& r : sends) r.wait(options.timeout);
  }
  for (auto& r : done_receives) r.wait(options.timeout);
  ex.forget_remote_keys_before(epoch - 1);
  for (auto b : done_bytes) stats.bytes_received += static_cast<int64_t>(b);
  if (stats.useful_bytes > 0)
    stats.wire_to_useful = static_cast<double>(stats.bytes_received + copied_into_me) / stats.useful_bytes;
  return stats;
}

}  // namespace tessera::transport
