// The NCCL communicator (built with TESSERA_WITH_CUDA) against a CPU oracle, in real processes
// started by tessera-launch, one GPU per rank (local rank modulo the devices there). Device memory
// comes from cudaMalloc and is wrapped as CUDA tensors without LibTorch's CUDA kernels, so the test
// also runs against a CPU-only LibTorch. Inputs are small integers (exact in every dtype), so the
// expected results, computed on the CPU in fp32, are compared bitwise; outputs start NaN-filled
// (or 99 for integers) and must be fully overwritten. No CUDA device: exits 77 (ctest: skipped).
// <torch/torch.h> comes before Catch: c10's logging header defines a glog-style CHECK that would
// otherwise replace Catch's (the other tests get LibTorch first through the precompiled header).
#include <torch/torch.h>
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "core/error.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"
#include "transport/nccl/nccl_info.h"
#include "transport/store.h"

using namespace tessera::transport;

namespace {

void cuda_ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}

// Not mp_world.h's MpWorld: that one makes a Gloo world communicator, and the device check's build
// has no Gloo.
struct World {
  int rank = env_int("RANK", 0);
  int size = env_int("WORLD_SIZE", 1);
  int device = 0;
  std::chrono::milliseconds timeout{env_int("TESSERA_TEST_TIMEOUT_MS", 60000)};
  std::shared_ptr<Store> store;

  static World& get() {
    static World w;
    return w;
  }
  std::shared_ptr<Communicator> nccl(const std::string& name) const {
    CommunicatorOptions co;
    co.name = name;
    co.timeout = timeout;
    return Communicator::nccl(store, rank, size, device, co);
  }

 private:
  World() {
    int count = 0;
    cudaGetDeviceCount(&count);
    device = env_int("LOCAL_RANK", rank) % std::max(count, 1);
    StoreOptions so;
    so.timeout = timeout;
    store = Store::from_env(so);
  }
};

// A CUDA tensor holding `cpu`'s bytes (its own cudaMalloc'ed memory, freed with the tensor).
at::Tensor to_gpu(const at::Tensor& cpu) {
  auto c = cpu.contiguous();
  const size_t bytes = c.numel() * c.element_size();
  void* ptr = nullptr;
  cuda_ok(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)), "cudaMalloc");
  if (bytes) cuda_ok(cudaMemcpy(ptr, c.data_ptr(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
  int device = 0;
  cudaGetDevice(&device);
  return at::for_blob(ptr, {c.numel()})
      .target_device(c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device)))
      .options(at::TensorOptions().dtype(c.scalar_type()).device(c10::kCUDA, device))
      .deleter([](void* p) { cudaFree(p); })
      .make_tensor();
}

at::Tensor to_cpu(const at::Tensor& gpu) {
  auto out = torch::empty({gpu.numel()}, torch::dtype(gpu.scalar_type()));
  const size_t bytes = gpu.numel() * gpu.element_size();
  if (bytes) cuda_ok(cudaMemcpy(out.data_ptr(), gpu.data_ptr(), bytes, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
  return out;
}

// What an output starts as: NaN for floating types, 99 for integers.
at::Tensor poisoned(int64_t n, at::ScalarType dtype) {
  const double fill = c10::isFloatingType(dtype) ? std::numeric_limits<double>::quiet_NaN() : 99.0;
  return to_gpu(torch::full({n}, fill, torch::dtype(dtype)));
}

// Rank r's input: (7 i + 3 r + 11 salt) mod 97 - 40, integers exact in every dtype used here.
at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, int salt = 0) {
  auto i = torch::arange(n, torch::kLong);
  return ((i * 7 + r * 3 + salt * 11) % 97 - 40).to(dtype);
}

at::Tensor expected_reduce(int size, int64_t n, at::ScalarType dtype, ReduceOp op, int salt = 0) {
  at::Tensor acc;
  for (int r = 0; r < size; ++r) {
    auto x = input_of(r, n, dtype, salt).to(torch::kFloat);
    if (!acc.defined()) acc = x;
    else acc = op == ReduceOp::max ? torch::maximum(acc, x) : acc + x;
  }
  if (op == ReduceOp::avg) acc = acc / static_cast<double>(size);
  return acc.to(dtype);
}

bool same(const at::Tensor& gpu, const at::Tensor& expected) { return torch::equal(to_cpu(gpu), expected); }

}  // namespace

TEST_CASE("every NCCL collective matches the CPU oracle bitwise", "[nccl]") {
  auto& w = World::get();
  auto comm = w.nccl("nccl_world");
  const int size = comm->size(), me = comm->rank();
  for (auto dtype : {torch::kFloat, torch::kBFloat16, torch::kHalf, torch::kLong}) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{13}, int64_t{1009}, int64_t{(1 << 20) + 7}}) {
      INFO("dtype " << c10::toString(dtype) << " n " << n << " size " << size);
      std::vector<ReduceOp> ops{ReduceOp::sum, ReduceOp::max};
      if (c10::isFloatingType(dtype)) ops.push_back(ReduceOp::avg);
      for (auto op : ops) {
        auto t = to_gpu(input_of(me, n, dtype));
        comm->all_reduce(t, {{}, op})->wait();
        CHECK(same(t, expected_reduce(size, n, dtype, op)));
      }
      {
        auto in = to_gpu(input_of(me, n * size, dtype, 1));
        auto out = poisoned(n, dtype);
        comm->reduce_scatter(in, out)->wait();
        CHECK(same(out, expected_reduce(size, n * size, dtype, ReduceOp::sum, 1).narrow(0, me * n, n)));
        CHECK(same(in, input_of(me, n * size, dtype, 1)));
      }
      {
        auto out = poisoned(n * size, dtype);
        comm->all_gather(to_gpu(input_of(me, n, dtype, 2)), out)->wait();
        auto host = to_cpu(out);
        for (int r = 0; r < size; ++r) CHECK(torch::equal(host.narrow(0, r * n, n), input_of(r, n, dtype, 2)));
      }
      {
        auto buffer = torch::full({n * size}, 99, torch::dtype(dtype));
        buffer.narrow(0, me * n, n).copy_(input_of(me, n, dtype, 4));
        auto gpu = to_gpu(buffer);
        comm->all_gather_in_place(gpu)->wait();
        auto host = to_cpu(gpu);
        for (int r = 0; r < size; ++r) CHECK(torch::equal(host.narrow(0, r * n, n), input_of(r, n, dtype, 4)));
      }
      {
        auto t = to_gpu(input_of(me, n, dtype, 5));
        comm->reduce(t, 0)->wait();
        if (me == 0) CHECK(same(t, expected_reduce(size, n, dtype, ReduceOp::sum, 5)));
      }
      {
        std::vector<int64_t> counts;
        int64_t total = 0;
        for (int r = 0; r < size; ++r) total += counts.emplace_back(n == 0 ? 0 : (n + r) % 5 * (r + 1) + n / 3);
        auto out = poisoned(total, dtype);
        comm->all_gather_uneven(to_gpu(input_of(me, counts[me], dtype, 3)), out, counts)->wait();
        auto host = to_cpu(out);
        int64_t at = 0;
        for (int r = 0; r < size; ++r) {
          CHECK(torch::equal(host.narrow(0, at, counts[r]), input_of(r, counts[r], dtype, 3)));
          at += counts[r];
        }
      }
      {
        auto t = me == size - 1 ? to_gpu(input_of(me, n, dtype, 4)) : poisoned(n, dtype);
        comm->broadcast(t, size - 1)->wait();
        CHECK(same(t, input_of(size - 1, n, dtype, 4)));
      }
      {
        std::vector<at::Tensor> chunks;
        for (int j = 0; j < size; ++j) chunks.push_back(input_of(me, n, dtype, 5 + j));
        auto out = poisoned(n * size, dtype);
        comm->all_to_all(to_gpu(torch::cat(chunks)), out)->wait();
        auto host = to_cpu(out);
        for (int r = 0; r < size; ++r) CHECK(torch::equal(host.narrow(0, r * n, n), input_of(r, n, dtype, 5 + me)));
      }
      if (size > 1) {  // a ring; even members send first
        const int next = (me + 1) % size, prev = (me + size - 1) % size;
        auto out = to_gpu(input_of(me, n, dtype, 6));
        auto got = poisoned(n, dtype);
        if (me % 2 == 0) {
          comm->send(out, next, 7);
          comm->recv(got, prev, 7)->wait();
        } else {
          comm->recv(got, prev, 7);
          comm->send(out, next, 7)->wait();
        }
        CHECK(same(got, input_of(prev, n, dtype, 6)));
      }
    }
  }
  comm->barrier()->wait();
}

// The operation's stream waits for the stream that produced its input: the input is written by a
// long queue of copies on a non-blocking stream, and the result is read back on the legacy stream
// (which does not wait for that one), so a missing wait reads a stale input.
TEST_CASE("an NCCL operation waits for the producer's stream", "[nccl]") {
  auto& w = World::get();
  auto comm = w.nccl("nccl_producer");
  const int64_t n = int64_t{64} << 20;  // 256 MiB of fp32
  cudaStream_t producer = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&producer, cudaStreamNonBlocking), "cudaStreamCreate");
  auto source = to_gpu(torch::full({n}, 1.0f));
  auto scratch = to_gpu(torch::full({n}, 2.0f));
  auto t = to_gpu(torch::zeros({n}));
  const size_t bytes = n * sizeof(float);
  for (int i = 0; i < 16; ++i)
    cuda_ok(cudaMemcpyAsync(scratch.data_ptr(), source.data_ptr(), bytes, cudaMemcpyDeviceToDevice, producer), "copy");
  cuda_ok(cudaMemcpyAsync(t.data_ptr(), scratch.data_ptr(), bytes, cudaMemcpyDeviceToDevice, producer), "copy");
  ReduceOptions options;
  options.cuda_stream = producer;
  comm->all_reduce(t, options)->wait();
  CHECK(same(t, torch::full({n}, static_cast<float>(w.size))));
  cudaStreamSynchronize(producer);
  cudaStreamDestroy(producer);
}

// Each refusal breaks its communicator (the sequencer's rule: after a failure every later
// operation fails with it), so each gets its own.
TEST_CASE("the NCCL communicator refuses host tensors and unsupported dtypes by name", "[nccl]") {
  auto& w = World::get();
  {
    auto comm = w.nccl("nccl_refuses_host");
    try {
      comm->all_reduce(torch::ones({8}))->wait();
      FAIL("a host tensor was accepted");
    } catch (const tessera::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("must be on a CUDA device"));
      CHECK_THAT(e.what(), Catch::Contains("cpu"));
    }
    try {
      comm->all_reduce(to_gpu(torch::ones({8})))->wait();
      FAIL("the communicator went on after a failed operation");
    } catch (const tessera::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("must be on a CUDA device"));
    }
  }
  {
    auto comm = w.nccl("nccl_refuses_bool");
    try {
      comm->all_reduce(to_gpu(torch::ones({8}, torch::kBool)))->wait();
      FAIL("a bool tensor was accepted");
    } catch (const tessera::Error& e) {
      CHECK_THAT(e.what(), Catch::Contains("Bool"));
    }
  }
}

// Two ranks on one GPU (the device check's machine has one): NCCL either runs them or refuses
// with its own message; either way every rank returns within the timeout (no hang).
TEST_CASE("two ranks sharing one GPU finish: a correct sum or NCCL's refusal", "[.shared_gpu]") {
  auto& w = World::get();
  try {
    auto comm = w.nccl("nccl_shared");
    auto t = to_gpu(input_of(w.rank, 1009, torch::kFloat));
    comm->all_reduce(t)->wait();
    const bool right = same(t, expected_reduce(w.size, 1009, torch::kFloat, ReduceOp::sum));
    std::printf("[rank%d] shared GPU: NCCL ran %d ranks on one device; the sum is %s\n", w.rank, w.size,
                right ? "right" : "WRONG");
    CHECK(right);
  } catch (const tessera::Error& e) {
    std::printf("[rank%d] shared GPU: refused: %s\n", w.rank, e.what());
    CHECK_THAT(e.what(), Catch::Contains("NCCL"));
  }
}

// Rank 1 never joins: rank 0's initialisation ends with a timeout naming itself, not a hang.
TEST_CASE("an NCCL communicator that a rank never joins times out", "[.init_timeout]") {
  auto& w = World::get();
  REQUIRE(w.size == 2);
  if (w.rank == 0) {
    CommunicatorOptions co;
    co.name = "nccl_lonely";
    co.timeout = std::chrono::milliseconds(3000);
    const auto start = std::chrono::steady_clock::now();
    try {
      Communicator::nccl(w.store, 0, 2, w.device, co);
      FAIL("the communicator was made without rank 1");
    } catch (const tessera::TransportError& e) {
      CHECK_THAT(e.what(), Catch::Contains("timed out after 3000 ms"));
      CHECK_THAT(e.what(), Catch::Contains("rank 0 of 2"));
    }
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(30));
    w.store->set("nccl_lonely_done", "1");
  } else {
    w.store->get("nccl_lonely_done", std::chrono::seconds(60));
  }
}

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("no CUDA device (%s): the NCCL test is skipped\n", e == cudaSuccess ? "0 devices" : cudaGetErrorString(e));
    return 77;
  }
  std::printf("NCCL %s, %d CUDA device(s)\n", nccl_version().c_str(), count);
  return Catch::Session().run(argc, argv);
}
