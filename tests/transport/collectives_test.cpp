// Every collective of the Gloo communicator at 2 and 4 processes (run through tessera-launch),
// on the whole job and on sub-groups, fp32/bf16/fp16, sizes 0, 1, primes, a few MB and 32 MiB. Each rank
// builds every rank's input locally (a closed form of rank and index), so the expected result is
// computed here, in fp32, and compared bitwise.
#include <catch2/catch.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <random>
#include <thread>

#include "core/error.h"
#include "mp_world.h"
#include "transport/detail/c10d_store.h"
#include "transport/gloo/exchange_all_reduce.h"

using namespace tessera::transport;
using tessera::transport::testing::MpWorld;

namespace {

// Rank r's input of n elements: (7 i + 3 r + 11 salt) mod 97 - 40, integers in [-40, 56], exact
// in bf16/fp16/fp32, so any summation order in fp32 gives the same (exact) sum. Built by repeating
// its period of 97 (int64 `%` over a few million elements took seconds here, most of the np4 run).
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, int salt = 0) {
  auto j = torch::arange(97, torch::kLong);
  auto period = ((j * 7 + r * 3 + salt * 11) % 97 - 40).to(torch::kFloat);
  return period.repeat({(n + 96) / 97}).narrow(0, 0, n).to(dtype);
}

// What reducing every member's input in fp32 and casting once gives.
at::Tensor expected_reduce(const std::vector<int>& members, int64_t n, at::ScalarType dtype, ReduceOp op, int salt = 0) {
  at::Tensor acc;
  for (int r : members) {
    auto x = input_of(r, n, dtype, salt).to(torch::kFloat);
    if (!acc.defined()) acc = x;
    else acc = op == ReduceOp::max ? torch::maximum(acc, x) : acc + x;
  }
  if (op == ReduceOp::avg) acc = acc / static_cast<double>(members.size());
  return acc.to(dtype);
}

const std::vector<at::ScalarType> kTypes{torch::kFloat, torch::kBFloat16, torch::kHalf};
const std::vector<int64_t> kSizes{0, 1, 2, 13, 1009, (1 << 20) + 7};

std::vector<int> iota(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

// Runs every collective on `comm`, whose member i is job rank members[i].
void check_all_collectives(Communicator& comm, const std::vector<int>& members) {
  const int size = comm.size(), me = comm.rank();
  const int my_job_rank = members[me];
  for (auto dtype : kTypes) {
    for (int64_t n : kSizes) {
      // fp16 takes bf16's path (fp32 reduction, byte moves): the few-MB size once is enough.
      if (dtype == torch::kHalf && n > (1 << 16)) continue;
      INFO("communicator " << comm.name() << " dtype " << c10::toString(dtype) << " n " << n);
      for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        auto t = input_of(my_job_rank, n, dtype);
        comm.all_reduce(t, {{}, op})->wait();
        CHECK(torch::equal(t, expected_reduce(members, n, dtype, op)));
      }
      {  // reduce_scatter: n elements per rank
        auto in = input_of(my_job_rank, n * size, dtype, 1);
        auto keep = in.clone();
        auto out = torch::full({n}, 99, dtype);
        comm.reduce_scatter(in, out)->wait();
        auto full = expected_reduce(members, n * size, dtype, ReduceOp::sum, 1);
        CHECK(torch::equal(out, full.narrow(0, me * n, n)));
        CHECK(torch::equal(in, keep));
      }
      {  // all_gather
        auto in = input_of(my_job_rank, n, dtype, 2);
        auto out = torch::full({n * size}, 99, dtype);
        comm.all_gather(in, out)->wait();
        for (int i = 0; i < size; ++i) CHECK(torch::equal(out.narrow(0, i * n, n), input_of(members[i], n, dtype, 2)));
      }
      {  // all_gather_in_place: chunk i of the buffer is member i's contribution, NaN-free check
        auto buffer = torch::full({n * size}, 99, dtype);
        buffer.narrow(0, me * n, n).copy_(input_of(my_job_rank, n, dtype, 4));
        comm.all_gather_in_place(buffer)->wait();
        for (int i = 0; i < size; ++i)
          CHECK(torch::equal(buffer.narrow(0, i * n, n), input_of(members[i], n, dtype, 4)));
      }
      for (int root = 0; root < size; root += std::max(1, size - 1)) {  // reduce to the first and last member
        for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          auto t = input_of(my_job_rank, n, dtype, 5);
          comm.reduce(t, root, {{}, op})->wait();
          if (me == root) CHECK(torch::equal(t, expected_reduce(members, n, dtype, op, 5)));
        }
      }
      {  // all_gather_uneven: member i contributes (n + i) % 5 * (i + 1) elements (some zero)
        std::vector<int64_t> counts;
        int64_t total = 0;
        for (int i = 0; i < size; ++i) total += counts.emplace_back(n == 0 ? 0 : (n + i) % 5 * (i + 1) + n / 3);
        auto in = input_of(my_job_rank, counts[me], dtype, 3);
        auto out = torch::full({total}, 99, dtype);
        comm.all_gather_uneven(in, out, counts)->wait();
        int64_t at = 0;
        for (int i = 0; i < size; ++i) {
          CHECK(torch::equal(out.narrow(0, at, counts[i]), input_of(members[i], counts[i], dtype, 3)));
          at += counts[i];
        }
      }
      {  // broadcast from the last member
        auto t = me == size - 1 ? input_of(my_job_rank, n, dtype, 4) : torch::full({n}, 99, dtype);
        comm.broadcast(t, size - 1)->wait();
        CHECK(torch::equal(t, input_of(members[size - 1], n, dtype, 4)));
      }
      {  // all_to_all: chunk j of member i's input is input_of(i, .., salt 5 + j)
        std::vector<at::Tensor> chunks;
        for (int j = 0; j < size; ++j) chunks.push_back(input_of(my_job_rank, n, dtype, 5 + j));
        auto in = torch::cat(chunks);
        auto out = torch::full({n * size}, 99, dtype);
        comm.all_to_all(in, out)->wait();
        for (int i = 0; i < size; ++i)
          CHECK(torch::equal(out.narrow(0, i * n, n), input_of(members[i], n, dtype, 5 + me)));
      }
      if (size > 1) {  // send/recv around a ring
        auto next = (me + 1) % size, prev = (me + size - 1) % size;
        auto out = input_of(my_job_rank, n, dtype, 6);
        auto got = torch::full({n}, 99, dtype);
        // Even members send first: program order differs per rank, yet pairs match.
        if (me % 2 == 0) {
          comm.send(out, next, 7);
          comm.recv(got, prev, 7)->wait();
        } else {
          comm.recv(got, prev, 7);
          comm.send(out, next, 7)->wait();
        }
        CHECK(torch::equal(got, input_of(members[prev], n, dtype, 6)));
      }
    }
  }
  comm.barrier()->wait();
}

}  // namespace

TEST_CASE("every collective on the whole job", "[collectives]") {
  auto& w = MpWorld::get();
  check_all_collectives(*w.world, iota(w.size));
}

TEST_CASE("every collective on sub-groups; a rank in several groups", "[collectives]") {
  auto& w = MpWorld::get();
  const int n = w.size;
  // Reversed order: group rank 0 is the job's last rank.
  std::vector<int> reversed;
  for (int r = n - 1; r >= 0; --r) reversed.push_back(r);
  auto g = w.world->group(reversed, "reversed");
  REQUIRE(g);
  CHECK(g->rank() == n - 1 - w.rank);
  check_all_collectives(*g, reversed);
  if (n >= 4) {
    // Data-parallel style pairs {0,2} and {1,3}, then a group of three that overlaps both.
    std::vector<int> pair = w.rank % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3};
    auto even = w.world->group({0, 2}, "even");
    auto odd = w.world->group({1, 3}, "odd");
    CHECK(static_cast<bool>(even) == (w.rank % 2 == 0));
    CHECK(static_cast<bool>(odd) == (w.rank % 2 == 1));
    check_all_collectives(even ? *even : *odd, pair);
    std::vector<int> three{3, 1, 2};
    auto g3 = w.world->group(three);
    if (w.rank == 0) {
      CHECK_FALSE(g3);
    } else {
      REQUIRE(g3);
      CHECK(g3->name() == "world.g3_1_2");
      check_all_collectives(*g3, three);
    }
    // Ranks 0 and 1 have made different numbers of groups by now (0 is not in g3): a group of both
    // must still meet (it once waited forever on a per-rank count in the store key).
    if (auto first_two = w.world->group({0, 1}, "after_uneven")) check_all_collectives(*first_two, {0, 1});
  }
  w.world->barrier()->wait();
}

TEST_CASE("two members: all-reduce of random values is the fp32 result rounded once, bitwise", "[collectives]") {
  // Two members run the pair exchange (transport/gloo/pair_all_reduce.h): each element is
  // combined once, in fp32 for bf16/fp16 (double for double), divided by 2 for avg, rounded once:
  // what gloo's ring or bcube at two ranks gave before it. Random values (their sums are not exact
  // in fp32), sizes around the 1 MiB segments (2^18 fp32 elements) and more segments per half than
  // the two in flight.
  auto& w = MpWorld::get();
  // Pairs {0,1}, {2,3}, ... (every rank takes part in making each group); an odd last rank sits out.
  std::shared_ptr<Communicator> pair = w.size == 2 ? w.world : nullptr;
  for (int r = 0; w.size != 2 && r + 1 < w.size; r += 2)
    if (auto g = w.world->group({r, r + 1}, "pair" + std::to_string(r))) pair = g;
  if (!pair) return;
  const int first = w.rank / 2 * 2;
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kDouble}) {
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1009}, int64_t{1} << 18, (int64_t{1} << 18) + 1,
                      5 * (int64_t{1} << 18) + 3}) {
      auto input = [&](int r) {
        return torch::randn({n}, at::make_generator<at::CPUGeneratorImpl>(uint64_t(1000 * r + n)), torch::kDouble)
            .to(dtype);
      };
      const auto compute = dtype == torch::kDouble ? torch::kDouble : torch::kFloat;
      auto a = input(first).to(compute), b = input(first + 1).to(compute);
      for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        INFO("dtype " << c10::toString(dtype) << " n " << n << " op " << int(op));
        auto expected = op == ReduceOp::max ? torch::maximum(a, b) : a + b;
        if (op == ReduceOp::avg) expected = expected / 2;
        auto t = input(w.rank);
        pair->all_reduce(t, {{}, op})->wait();
        CHECK(torch::equal(t, expected.to(dtype)));
      }
    }
  }
  pair->barrier()->wait();
}

TEST_CASE("more than two members: all-reduce of random values is bitwise Gloo's ring (c10d's ProcessGroupGloo)",
          "[collectives]") {
  // More members run the exchange all-reduce (transport/gloo/exchange_all_reduce.h), which adds
  // each chunk's copies in the ring's order at the ring's chunk boundaries. The oracle is c10d's
  // ProcessGroupGloo (gloo::allreduce's ring) on the same random values: sums that round in fp32,
  // so another order or boundary shows. Sizes with empty chunks (3, 5 at 4 members), around the
  // ring's 2 x members segments, past 1 MiB segments (more segments per chunk) and past the 4 MiB
  // pieces (two rounds). Members: the whole job (4 at np4) and a group of 3.
  auto& w = MpWorld::get();
  std::vector<std::pair<std::vector<int>, std::string>> groups;
  if (w.size > 2) groups.push_back({iota(w.size), "ring_all"});
  if (w.size > 3) groups.push_back({iota(3), "ring_three"});
  for (auto& [members, name] : groups) {
    std::shared_ptr<Communicator> comm = members.size() == size_t(w.size) ? w.world : w.world->group(members, name);
    if (!comm) continue;
    const int me = comm->rank(), size = comm->size();
    auto opts = c10d::ProcessGroupGloo::Options::create(w.timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    c10d::ProcessGroupGloo ring(c10d_store(*w.store, name), me, size, opts);
    for (auto dtype : {torch::kFloat, torch::kDouble}) {
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{5}, int64_t{1009}, (int64_t{1} << 18) + 1,
                        3 * (int64_t{1} << 20) + 5, 5 * (int64_t{1} << 20) + 3}) {
        if (dtype == torch::kDouble && n > (1 << 20)) continue;
        for (auto op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
          INFO("members " << size << " dtype " << c10::toString(dtype) << " n " << n << " op " << int(op));
          auto input = torch::randn({n}, at::make_generator<at::CPUGeneratorImpl>(uint64_t(7919 * me + n)), dtype);
          auto expected = input.clone();
          std::vector<at::Tensor> v{expected};
          c10d::AllreduceOptions o;
          o.reduceOp = op == ReduceOp::max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
          ring.allreduce(v, o)->wait();
          if (op == ReduceOp::avg) expected.div_(size);
          auto t = input.clone();
          comm->all_reduce(t, {{}, op})->wait();
          CHECK(torch::equal(t, expected));
        }
      }
    }
    comm->barrier()->wait();
  }
}

TEST_CASE("ring chunks: every element in one chunk, chunks as Gloo's ring cuts them", "[collectives]") {
  // Gloo's ring at 4 members: 8 segments below 8 MiB (2 per chunk), ceil(bytes / 1 MiB) rounded up
  // to a multiple of 4 above; segments element-aligned.
  CHECK(ring_chunk_elements(1, 4, 4) == 2);             // 8 segments of 4 bytes, 2 a chunk
  CHECK(ring_chunk_elements(1009, 4, 4) == 254);        // ceil(1009 / 8) = 127 a segment
  CHECK(ring_chunk_elements(int64_t{3} << 20, 4, 4) == (int64_t{3} << 18));  // 12 MiB: 12 segments of 1 MiB
  CHECK(ring_chunk_elements((int64_t{3} << 20) + 5, 4, 4) == 4 * 196609);  // 16 segments of 196609
  CHECK(ring_chunk_elements(7, 3, 8) == 4);             // 6 segments of 2 doubles
}

TEST_CASE("tens of MB: all-reduce, reduce-scatter and all-gather on the whole job", "[collectives][large]") {
  // 8 Mi + 3 fp32 elements (32 MiB) per all-reduce and all-gather input; the reduce-scatter input
  // holds 32 MiB in total. bf16 all-reduce of 16 MiB. Closed forms as above (integer inputs).
  auto& w = MpWorld::get();
  Communicator& comm = *w.world;
  const int size = comm.size(), me = comm.rank();
  const auto members = iota(size);
  const int64_t n = (int64_t{1} << 23) + 3;
  for (auto dtype : {torch::kFloat, torch::kBFloat16}) {
    INFO("dtype " << c10::toString(dtype));
    auto t = input_of(me, n, dtype);
    comm.all_reduce(t)->wait();
    CHECK(torch::equal(t, expected_reduce(members, n, dtype, ReduceOp::sum)));
  }
  const int64_t chunk = (int64_t{1} << 23) / size;
  auto in = input_of(me, chunk * size, torch::kFloat, 1);
  auto out = torch::full({chunk}, 99, torch::kFloat);
  comm.reduce_scatter(in, out, {{}, ReduceOp::avg})->wait();
  CHECK(torch::equal(out, expected_reduce(members, chunk * size, torch::kFloat, ReduceOp::avg, 1).narrow(0, me * chunk, chunk)));
  auto part = input_of(me, chunk, torch::kFloat, 2);
  auto gathered = torch::full({chunk * size}, 99, torch::kFloat);
  comm.all_gather(part, gathered)->wait();
  for (int i = 0; i < size; ++i) CHECK(torch::equal(gathered.narrow(0, i * chunk, chunk), input_of(i, chunk, torch::kFloat, 2)));
}

TEST_CASE("back-to-back 16 MiB reduce-scatters at skewed timing keep every input intact", "[collectives][large]") {
  // A reduce-scatter's input leaves for the peers while this rank already holds its reduced chunk:
  // no rank may write its result (or anything) over bytes still being sent. Gloo's
  // ReduceScatterHalvingDoubling did: rank 1 copied its chunk to the front of the buffer it was
  // still sending from, so with messages larger than the socket buffers rank 0 received rank 1's
  // result instead of its input (ZeRO-3 gradients wrong from step 2 at width 2048). The ranks
  // stall in turns so that sends find the peer's socket full; values are random (not exact in any
  // order), summed in rank order here as the communicator does.
  auto& w = MpWorld::get();
  Communicator& comm = *w.world;
  const int size = comm.size(), me = comm.rank();
  const int64_t chunk = (int64_t{1} << 22) / size;  // 16 MiB of fp32 input per rank
  std::mt19937 jitter(17);
  for (int round = 0; round < 6; ++round) {
    INFO("round " << round);
    auto input_of_rank = [&](int r) {
      return torch::randn({chunk * size}, at::make_generator<at::CPUGeneratorImpl>(uint64_t(100 * round + r)));
    };
    auto in = input_of_rank(me);
    auto out = torch::full({chunk}, std::nanf(""), torch::kFloat);
    const auto stall = std::chrono::microseconds(jitter() % 3000);
    if (round % size == me) std::this_thread::sleep_for(stall);
    comm.reduce_scatter(in, out)->wait();
    auto expected = input_of_rank(0).narrow(0, me * chunk, chunk).clone();
    for (int r = 1; r < size; ++r) expected.add_(input_of_rank(r).narrow(0, me * chunk, chunk));
    CHECK(torch::equal(out, expected));
    CHECK(torch::equal(in, input_of_rank(me)));
  }
}

TEST_CASE("program order holds under skewed timing and many threads", "[collectives]") {
  auto& w = MpWorld::get();
  std::mt19937 rng(1234 + w.rank);
  std::uniform_int_distribution<int> delay_ms(0, 15);
  // 24 operations of different sizes and kinds issued without waiting, each after a random,
  // rank-dependent delay, alternately from two threads handing the turn to each other.
  const int ops = 24;
  std::vector<at::Tensor> tensors(ops);
  std::vector<std::shared_ptr<Work>> works(ops);
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;
  auto issuer = [&](int parity) {
    for (int i = parity; i < ops; i += 2) {
      std::unique_lock<std::mutex> lock(m);
      cv.wait(lock, [&] { return turn == i; });
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng) + 20 * w.rank * (i % 3 == 0)));
      int64_t n = 1 + 997 * i;
      tensors[i] = input_of(w.rank, n, torch::kFloat, i);
      works[i] = i % 4 == 3 ? w.world->broadcast(tensors[i], i % w.size) : w.world->all_reduce(tensors[i]);
      CHECK(works[i]->sequence() > 0);
      ++turn;
      cv.notify_all();
    }
  };
  std::thread a(issuer, 0), b(issuer, 1);
  a.join();
  b.join();
  for (int i = ops - 1; i >= 0; --i) works[i]->wait();
  for (int i = 1; i < ops; ++i) CHECK(works[i]->sequence() == works[i - 1]->sequence() + 1);
  for (int i = 0; i < ops; ++i) {
    int64_t n = 1 + 997 * i;
    auto expect = i % 4 == 3 ? input_of(i % w.size, n, torch::kFloat, i)
                             : expected_reduce(iota(w.size), n, torch::kFloat, ReduceOp::sum, i);
    CHECK(torch::equal(tensors[i], expect));
  }
}

TEST_CASE("bad arguments are refused before anything is issued", "[collectives]") {
  auto& w = MpWorld::get();
  auto t = torch::zeros({4, 4});
  CHECK_THROWS_AS(w.world->all_reduce(t), tessera::TransportError);
  CHECK_THROWS_AS(w.world->reduce_scatter(torch::zeros({5}), torch::zeros({5})), tessera::TransportError);
  CHECK_THROWS_AS(w.world->broadcast(torch::zeros({2}), w.size), tessera::TransportError);
  CHECK_THROWS_AS(w.world->all_reduce(torch::zeros({2}, torch::kLong), {{}, ReduceOp::avg}), tessera::TransportError);
  CHECK_THROWS_AS(w.world->group({0, 0}), tessera::TransportError);
  w.world->barrier()->wait();  // nothing above was issued: the next sequence numbers still match
}

// Run alone (ctest transport.collectives.skip): rank 1 skips the 2nd all-reduce and waits; every
// other rank must raise the timeout error naming the communicator, the operation, #n and rank 1,
// then exit 42; the launcher then ends rank 1.
TEST_CASE("a rank that skips a collective makes the others time out", "[.skip]") {
  auto& w = MpWorld::get();
  auto t = torch::ones({16});
  w.world->all_reduce(t)->wait();  // the first one everybody does
  if (w.rank == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(120));
    return;
  }
  auto start = std::chrono::steady_clock::now();
  auto work = w.world->all_reduce(t);
  try {
    work->wait();
    FAIL("the all-reduce completed without rank 1");
  } catch (const tessera::TimeoutError& e) {
    std::string what = e.what();
    auto waited = std::chrono::steady_clock::now() - start;
    std::printf("rank %d got: %s\n", w.rank, what.c_str());
    std::fflush(stdout);
    const bool names_comm = what.find("communicator 'world'") != std::string::npos;
    const bool names_op = what.find("all_reduce #2") != std::string::npos;
    // Exactly rank 1: the ranks waiting in #2 (this one and the other) recorded their arrival.
    const std::string tail = "ranks that did not arrive: rank 1";
    const bool names_missing = what.size() >= tail.size() && what.compare(what.size() - tail.size(), tail.size(), tail) == 0;
    const bool in_time = waited < w.timeout + std::chrono::seconds(5);
    CHECK(names_comm);
    CHECK(names_op);
    CHECK(names_missing);
    CHECK(in_time);
    // A broken communicator fails at once.
    bool fails_fast = false;
    try {
      w.world->barrier()->wait(std::chrono::milliseconds(100));
    } catch (const tessera::TransportError&) {
      fails_fast = true;
    }
    CHECK(fails_fast);
    const bool ok = names_comm && names_op && names_missing && in_time && fails_fast;
    // Every rank that raised reports; all leave once all reported (rank 0 hosts the store).
    try {
      w.store->add("skip/reported", 1);
      for (int i = 0; i < 200 && w.store->add("skip/reported", 0) < w.size - 1; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } catch (const tessera::Error&) {
    }
    std::_Exit(ok ? 42 : 1);
  }
}

// Run alone (ctest transport.collectives.peer_lost): rank 1 exits (status 0) after the first
// all-reduce; rank 0 must get PeerLostError (or, if the loss is noticed only as silence, the
// timeout error naming rank 1) and exits 43, which the launcher reports.
TEST_CASE("a peer that goes away is reported, not waited for forever", "[.peerlost]") {
  auto& w = MpWorld::get();
  auto t = torch::ones({1 << 16});
  w.world->all_reduce(t)->wait();
  if (w.rank == 1) std::_Exit(0);
  try {
    w.world->all_reduce(t)->wait();
    FAIL("the all-reduce completed without rank 1");
  } catch (const tessera::PeerLostError& e) {
    std::printf("rank %d got peer lost: %s\n", w.rank, e.what());
    std::fflush(stdout);
    std::_Exit(43);
  } catch (const tessera::TimeoutError& e) {
    std::printf("rank %d got timeout: %s\n", w.rank, e.what());
    std::fflush(stdout);
    std::_Exit(std::string(e.what()).find("rank 1") != std::string::npos ? 43 : 1);
  }
}

// Run alone (ctest transport.liveness.stopped): rank 1 freezes itself with SIGSTOP after the first
// all-reduce, as a hung or stopped process would. Rank 0 waits in the second with the default
// 300 s timeout; the launcher must end the job within seconds, naming rank 1 and the all-reduce
// rank 0 waits in (from rank 0's heartbeats).
TEST_CASE("a stopped rank is named by the launcher in seconds", "[.stopped]") {
  auto& w = MpWorld::get();
  auto t = torch::ones({16});
  w.world->all_reduce(t)->wait();
  if (w.rank == 1) ::raise(SIGSTOP);
  w.world->all_reduce(t)->wait();
  FAIL("the all-reduce completed without rank 1");
}

// Run alone (ctest transport.liveness.slow): rank 1 is busy for 12 s (longer than the launcher's
// heartbeat timeout) before the all-reduce; it keeps beating, so the job is not ended and the
// collective completes within its own (60 s) timeout.
TEST_CASE("a slow but live rank keeps its collective's full timeout", "[.slow]") {
  auto& w = MpWorld::get();
  auto t = torch::ones({16});
  w.world->all_reduce(t)->wait();
  if (w.rank == 1) std::this_thread::sleep_for(std::chrono::seconds(12));
  w.world->all_reduce(t)->wait();
  CHECK(t[0].item<float>() == float(w.size * w.size));
}
