// The remote affine executor between two separately launched jobs (two_jobs.py): a source job of
// S ranks and a target job of T ranks move four tensors (row -> column resharding, replicated
// sources: replica choice, ZeRO-3 partitions: padding, column-major sources: staged rows) into
// NaN-filled (0xFF) targets; every target element must equal the closed-form oracle bitwise and
// padding must stay untouched. Then a
// batch the target job plans differently, and one whose targets overlap, must be refused on
// every process with no byte moved. Then ("[.affine_withdraw]") a target that gives up on the votes
// before a late source casts its own: the late source must not write, and both must say so.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/affine/builders.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "core/affine/zero_storage.h"
#include "transport/affine/remote_executor.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_peers.h"

using namespace tessera;
using namespace tessera::transport;
using affine::DType;
using affine::Dims;

namespace {

std::string env_str(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

// Calls f(index) for every index of box, row-major.
template <class F>
void for_each_index(const affine::Box& box, F&& f) {
  if (box.is_empty()) return;
  const int nd = box.ndim();
  Dims i = box.origin;
  for (;;) {
    f(i);
    int k = nd - 1;
    while (k >= 0 && ++i[k] == box.end(k)) i[k] = box.origin[k], --k;
    if (k < 0) return;
  }
}

int64_t linear(const Dims& shape, const Dims& index) {
  int64_t l = 0;
  for (int k = 0; k < shape.size(); ++k) l = l * shape[k] + index[k];
  return l;
}

// The oracle: element `l` of tensor `tid`, as bytes of its dtype.
void value_bytes(int tid, DType dtype, int64_t l, uint8_t* out) {
  if (dtype == DType::f32) {
    float v = static_cast<float>(tid * 1000 + l) * 0.5f + 0.25f;
    std::memcpy(out, &v, 4);
  } else {  // bf16: a positive normal number per element, never 0xFFFF
    uint16_t bits = static_cast<uint16_t>(0x3F80 + (l * 7 + tid) % 512);
    std::memcpy(out, &bits, 2);
  }
}

struct Tensor {
  affine::TensorMap source, target;
  affine::Plan plan;
  std::map<int, std::vector<uint8_t>> buffers;  // this process's buffer(s)
};

affine::TensorMap source_map(int tid, const affine::TensorInfo& info, int S) {
  if (tid == 0) return affine::contiguous_split(info, 0, affine::even_split_sizes(info.shape[0], S));
  if (tid == 1) return affine::replicated(info, S);
  if (tid == 2) return affine::zero3_partition(info, S);
  // Column-major copies on every source rank: rows are strided at the source (staged path).
  auto map = affine::replicated(info, S);
  for (auto& [rank, storage] : map.ranks)
    for (auto& piece : storage.pieces) piece.strides = Dims{1, info.shape[0]};
  return map;
}

affine::TensorMap target_map(int tid, const affine::TensorInfo& info, int T, bool disagree) {
  if (tid == 0) {
    auto sizes = affine::even_split_sizes(info.shape[1], T);
    if (disagree) {
      sizes.assign(T, 0);
      sizes[0] = info.shape[1];
    }
    return affine::contiguous_split(info, 1, sizes);
  }
  if (tid == 1) return affine::zero3_partition(info, T);
  if (tid == 2) return affine::replicated(info, T);
  return affine::contiguous_split(info, 0, affine::even_split_sizes(info.shape[0], T));
}

}  // namespace

TEST_CASE("remote affine transfer between two jobs; a disagreeing plan is refused everywhere", "[.affine]") {
  const int rank = std::atoi(env_str("RANK", "0").c_str());
  const int size = std::atoi(env_str("WORLD_SIZE", "1").c_str());
  const std::string job = env_str("TESSERA_JOB", "a"), peer_job = env_str("TESSERA_PEER_JOB", "b");
  const bool is_source = env_str("TESSERA_UCX_ROLE", "source") == "source";
  auto store = Store::from_env();
  UcxContext context({});
  UcxPeers peers(context, store, job, rank, size, "affine");
  const int peer_size = peers.connect(peer_job);
  const int S = is_source ? size : peer_size, T = is_source ? peer_size : size;
  const std::string source_job = is_source ? job : peer_job, target_job = is_source ? peer_job : job;
  INFO(job << " rank " << rank << ": " << S << " source ranks -> " << T << " target ranks");

  const std::vector<affine::TensorInfo> infos{{"w", DType::f32, {12, 10}}, {"b", DType::f32, {7}},
                                              {"e", DType::bf16, {5, 6}}, {"t", DType::f32, {6, 5}}};
  // A tiny budget: many rounds, the staging buffer reused after every flush.
  RemoteExecutorOptions options;
  options.staging_bytes = 64;
  RemoteExecutor executor(peers, "weights", options);
  int exposed = 0, withdrawn = 0;
  TransferHooks hooks;
  hooks.exposed = [&] { ++exposed; };
  hooks.withdrawn = [&] { ++withdrawn; };
  for (int round : {0, 1, 2}) {
    exposed = withdrawn = 0;
    const bool disagree = round == 1, overlap = round == 2;
    std::vector<Tensor> tensors(infos.size());
    std::vector<RemoteTransfer> batch;
    for (int tid = 0; tid < static_cast<int>(infos.size()); ++tid) {
      auto& t = tensors[tid];
      t.source = source_map(tid, infos[tid], S);
      t.target = target_map(tid, infos[tid], T, disagree && !is_source);
      t.plan = affine::plan(t.target, t.source);
      const auto& mine = is_source ? t.source.ranks.at(rank) : t.target.ranks.at(rank);
      const int64_t es = affine::element_size(infos[tid].dtype);
      auto& buffer = t.buffers[rank];
      buffer.assign(static_cast<size_t>(std::max<int64_t>(mine.buffer_elements, 1) * es), 0xFF);
      if (is_source)
        for (const auto& piece : mine.pieces)
          for_each_index(piece.box, [&](const Dims& i) {
            value_bytes(tid, infos[tid].dtype, linear(infos[tid].shape, i), &buffer[piece.address_of(i) * es]);
          });
    }
    for (int tid = 0; tid < static_cast<int>(infos.size()); ++tid) {
      RemoteTransfer rt;
      rt.plan = &tensors[tid].plan;
      for (int r = 0; r < S; ++r) rt.source_processes.push_back({source_job, r});
      for (int r = 0; r < T; ++r) rt.target_processes.push_back({target_job, r});
      const auto& mine = is_source ? tensors[tid].source.ranks.at(rank) : tensors[tid].target.ranks.at(rank);
      affine::LocalBuffer lb{tensors[tid].buffers[rank].data(), mine.buffer_elements, infos[tid].dtype};
      (is_source ? rt.source_buffers : rt.target_buffers)[rank] = lb;
      batch.push_back(std::move(rt));
    }
    if (overlap) {
      // Both jobs list tensor "w" twice: the target processes see their bytes written twice and
      // refuse; every process must raise the same refusal, and nothing moves.
      batch.push_back(batch[0]);
      try {
        executor.execute(batch, hooks);
        FAIL("a batch with overlapping targets was executed");
      } catch (const affine::TransferRefusedError& e) {
        std::string what = e.what();
        CHECK(what.find("refused on every process, no byte moved") != std::string::npos);
        CHECK(what.find("job '" + target_job + "' rank 0 refused: tensor") == std::string::npos);
        CHECK(what.find("written twice") != std::string::npos);
      }
      // A target refused by itself (never exposed); a source accepted, then learned of the refusal.
      CHECK(exposed == (is_source ? 1 : 0));
      CHECK(withdrawn == exposed);
      if (!is_source)
        for (auto& t : tensors)
          for (auto byte : t.buffers[rank]) REQUIRE(byte == 0xFF);
      continue;
    }
    if (disagree) {
      try {
        executor.execute(batch, hooks);
        FAIL("a batch planned differently by the target job was executed");
      } catch (const affine::TransferRefusedError& e) {
        std::string what = e.what();
        CHECK(what.find("refused on every process, no byte moved") != std::string::npos);
        CHECK(what.find("planned different batches") != std::string::npos);
      }
      CHECK(exposed == 1);  // every process accepted its own view, and learned of the mismatch
      CHECK(withdrawn == 1);
      if (!is_source)
        for (auto& t : tensors)
          for (auto byte : t.buffers[rank]) REQUIRE(byte == 0xFF);
      continue;
    }
    auto stats = executor.execute(batch, hooks);
    CHECK(exposed == 1);
    CHECK(withdrawn == 0);
    if (is_source) {
      CHECK(stats.bytes_sent > 0);
      CHECK(stats.rounds >= stats.bytes_sent / 64);
      // Tensor "t" comes from its lowest replica, rows strided at the source (120 bytes); segments
      // landing in one dense block are packed too and sent as one put per staging chunk.
      if (rank == 0) CHECK(stats.bytes_staged >= 6 * 5 * 4);
      CHECK(stats.puts <= stats.bytes_sent / 4);
      CHECK(stats.useful_bytes == 0);
    } else {
      int64_t expected_useful = 0;
      for (int tid = 0; tid < static_cast<int>(infos.size()); ++tid) {
        const int64_t es = affine::element_size(infos[tid].dtype);
        const auto& mine = tensors[tid].target.ranks.at(rank);
        auto& buffer = tensors[tid].buffers[rank];
        std::vector<bool> covered(buffer.size() / es, false);
        bool all_equal = true;
        for (const auto& piece : mine.pieces)
          for_each_index(piece.box, [&](const Dims& i) {
            uint8_t expect[8];
            value_bytes(tid, infos[tid].dtype, linear(infos[tid].shape, i), expect);
            const int64_t a = piece.address_of(i);
            covered[a] = true;
            all_equal = all_equal && std::memcmp(&buffer[a * es], expect, es) == 0;
            expected_useful += es;
          });
        CHECK(all_equal);
        bool padding_untouched = true;
        for (size_t a = 0; a < covered.size(); ++a)
          if (!covered[a])
            for (int64_t b = 0; b < es; ++b) padding_untouched = padding_untouched && buffer[a * es + b] == 0xFF;
        CHECK(padding_untouched);
      }
      CHECK(stats.useful_bytes == expected_useful);
      CHECK(stats.bytes_received == expected_useful);
      CHECK(stats.wire_to_useful == 1.0);
      std::printf("%s rank %d: received %lld bytes, useful %lld, wire/useful %.3f, rounds %lld\n", job.c_str(), rank,
                  (long long)stats.bytes_received, (long long)stats.useful_bytes, stats.wire_to_useful,
                  (long long)stats.rounds);
    }
  }
  // The store server (rank 0 of the job launched first) stays until everyone is done with the
  // store; it leaves only after all added, so a lost connection while polling means "all done".
  peers.store()->add("finished", 1);
  try {
    for (int i = 0; i < 600 && peers.store()->add("finished", 0) < S + T; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const tessera::TransportError&) {
  }
}

// The target job's processes wait for the votes at most 1.5 s; the source job votes 3 s late. A
// target withdraws (no process had committed: TransferHooks::withdrawn), so the late source, which
// then reads unanimous votes, must refuse to commit and move no byte. Without the commit counter
// it would write into targets that already gave up (and may be serving). Then a batch on time
// moves every byte: the epochs stayed in step.
TEST_CASE("remote transfer: a target that gave up on the votes is never written by a late voter", "[.affine_withdraw]") {
  const int rank = std::atoi(env_str("RANK", "0").c_str());
  const int size = std::atoi(env_str("WORLD_SIZE", "1").c_str());
  const std::string job = env_str("TESSERA_JOB", "a"), peer_job = env_str("TESSERA_PEER_JOB", "b");
  const bool is_source = env_str("TESSERA_UCX_ROLE", "source") == "source";
  auto store = Store::from_env();
  UcxContext context({});
  UcxPeers peers(context, store, job, rank, size, "withdraw");
  const int peer_size = peers.connect(peer_job);
  const int S = is_source ? size : peer_size, T = is_source ? peer_size : size;
  const std::string source_job = is_source ? job : peer_job, target_job = is_source ? peer_job : job;
  const affine::TensorInfo info{"w", DType::f32, {12, 10}};
  const auto source = source_map(0, info, S), target = target_map(0, info, T, false);
  const auto plan = affine::plan(target, source);
  const auto& mine = is_source ? source.ranks.at(rank) : target.ranks.at(rank);
  std::vector<uint8_t> buffer(static_cast<size_t>(std::max<int64_t>(mine.buffer_elements, 1) * 4), 0xFF);
  if (is_source)
    for (const auto& piece : mine.pieces)
      for_each_index(piece.box, [&](const Dims& i) { value_bytes(0, DType::f32, linear(info.shape, i), &buffer[piece.address_of(i) * 4]); });
  RemoteTransfer rt;
  rt.plan = &plan;
  for (int r = 0; r < S; ++r) rt.source_processes.push_back({source_job, r});
  for (int r = 0; r < T; ++r) rt.target_processes.push_back({target_job, r});
  (is_source ? rt.source_buffers : rt.target_buffers)[rank] = {buffer.data(), mine.buffer_elements, DType::f32};
  RemoteExecutorOptions options;
  options.timeout = std::chrono::milliseconds(is_source ? 30000 : 1500);
  RemoteExecutor executor(peers, "withdraw", options);
  int exposed = 0, withdrawn = 0;
  TransferHooks hooks;
  hooks.exposed = [&] { ++exposed; };
  hooks.withdrawn = [&] { ++withdrawn; };
  auto marks = peers.store()->shared("withdraw_test");
  std::string error;
  if (is_source) std::this_thread::sleep_for(std::chrono::seconds(3));
  try {
    executor.execute({rt}, hooks);
  } catch (const std::exception& e) {
    error = e.what();
  }
  INFO(job << " rank " << rank << ": " << error);
  CHECK(exposed == 1);
  if (is_source) {
    // The first late source to commit knows no byte moved; the next counts it among those that
    // may have committed first (the counter cannot tell refused commits apart: conservative).
    CHECK(withdrawn <= 1);
    CHECK_THAT(error, Catch::Contains("gave up waiting for the votes before this one committed"));
    marks->add("late_done", 1);
  } else {
    CHECK(withdrawn == 1);  // it withdrew before any process committed
    CHECK_THAT(error, Catch::Contains("timed out"));
    // Once every late source returned, no byte of the batch is here.
    marks->wait({"late_done"}, std::chrono::seconds(60));
    while (marks->add("late_done", 0) < S) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    bool untouched = true;
    for (auto byte : buffer) untouched = untouched && byte == 0xFF;
    CHECK(untouched);
  }
  // The next batch, on time: every target element arrives.
  exposed = withdrawn = 0;
  marks->add("ready", 1);
  while (marks->add("ready", 0) < S + T) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  executor.execute({rt}, hooks);
  CHECK(exposed == 1);
  CHECK(withdrawn == 0);
  if (!is_source) {
    bool all_equal = true;
    for (const auto& piece : mine.pieces)
      for_each_index(piece.box, [&](const Dims& i) {
        uint8_t expect[4];
        value_bytes(0, DType::f32, linear(info.shape, i), expect);
        all_equal = all_equal && std::memcmp(&buffer[piece.address_of(i) * 4], expect, 4) == 0;
      });
    CHECK(all_equal);
  }
  // The store's host (source rank 0) leaves last.
  marks->add("finished", 1);
  try {
    for (int i = 0; i < 600 && marks->add("finished", 0) < S + T; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const tessera::TransportError&) {
  }
}
