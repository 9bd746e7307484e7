// The NCCL backend of Communicator (GPU; built only with TESSERA_WITH_CUDA). Rank 0 of the
// communicator creates the NCCL unique id and publishes it in the communicator's store scope;
// every member joins with ncclCommInitRankConfig on its device. The NCCL communicator is
// non-blocking, so no NCCL call can hang: initialisation, every enqueue that answers
// ncclInProgress and every operation's stream are polled up to the communicator timeout, and a
// timeout aborts the NCCL communicator (ncclCommAbort) and reports "timed out", which the
// Communicator turns into a TimeoutError with the missing ranks. Operations run on one stream per
// communicator. send/recv ignore the tag (NCCL matches by program order per peer, which the
// sequencer already fixes).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "transport/detail/backend.h"
#include "transport/store.h"

namespace tessera::transport {
namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw TransportError(std::string("CUDA ") + what + " failed: " + cudaGetErrorString(e));
}

void check_nccl(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw TransportError(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(r));
}

ncclDataType_t nccl_type(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw TransportError(std::string("NCCL: dtype ") + c10::toString(t.scalar_type()) + " not supported");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return ncclSum;
    case ReduceOp::avg: return ncclAvg;
    case ReduceOp::max: return ncclMax;
  }
  return ncclSum;
}

class NcclBackend : public Backend {
 public:
  NcclBackend(std::shared_ptr<Store> store, int rank, int size, int device, const CommunicatorOptions& options)
      : rank_(rank), size_(size), device_(device), timeout_(options.timeout) {
    check_cuda(cudaSetDevice(device), "cudaSetDevice");
    ncclUniqueId id;
    if (rank == 0) {
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      store->set("nccl/unique_id", std::vector<uint8_t>(reinterpret_cast<uint8_t*>(&id),
                                                        reinterpret_cast<uint8_t*>(&id) + sizeof id));
    } else {
      auto bytes = store->get("nccl/unique_id", options.timeout);
      if (bytes.size() != sizeof id) throw TransportError("NCCL: unique id of wrong size in the store");
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    try {
      enqueued(ncclCommInitRankConfig(&comm_, size, id, rank, &config), "ncclCommInitRankConfig");
    } catch (const TransportError& e) {
      throw TransportError(std::string(e.what()) + " (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                           " on CUDA device " + std::to_string(device) + ")");
    }
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    check_cuda(cudaEventCreateWithFlags(&producer_done_, cudaEventDisableTiming), "cudaEventCreate");
  }

  // Finalizes (flushes) the NCCL communicator within the timeout, else aborts it.
  ~NcclBackend() override {
    if (comm_) {
      try {
        enqueued(ncclCommFinalize(comm_), "ncclCommFinalize");
        if (comm_) ncclCommDestroy(comm_);
      } catch (const std::exception&) {
        // enqueued() aborted the communicator: nothing left to destroy.
      }
    }
    if (producer_done_) cudaEventDestroy(producer_done_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  const std::string& name() const override { return name_; }

  // The operation's stream (non-blocking, so it does not sync with the default stream by itself)
  // waits for what the producer's stream has enqueued so far: inputs are complete before NCCL
  // reads them. Outputs are complete when sync() returns.
  void wait_for_producer(void* producer) override {
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");  // operations run on the sequencer's thread
    check_cuda(cudaEventRecord(producer_done_, static_cast<cudaStream_t>(producer)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, producer_done_, 0), "cudaStreamWaitEvent");
  }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    device_tensor(t);
    enqueued(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, stream_),
             "ncclAllReduce");
    sync("all_reduce");
  }

  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    device_tensor(in);
    device_tensor(out);
    enqueued(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in), nccl_op(op), comm_,
                               stream_),
             "ncclReduceScatter");
    sync("reduce_scatter");
  }

  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    device_tensor(in);
    device_tensor(out);
    enqueued(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in), comm_, stream_),
             "ncclAllGather");
    sync("all_gather");
  }

  void all_gather_in_place(at::Tensor& buffer) override {
    device_tensor(buffer);
    const int64_t chunk = buffer.numel() / size_;
    auto* own = static_cast<char*>(buffer.data_ptr()) + rank_ * chunk * buffer.element_size();
    enqueued(ncclAllGather(own, buffer.data_ptr(), chunk, nccl_type(buffer), comm_, stream_), "ncclAllGather");
    sync("all_gather_in_place");
  }

  void reduce(at::Tensor& t, int root, ReduceOp op) override {
    device_tensor(t);
    enqueued(ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), root, comm_, stream_),
             "ncclReduce");
    sync("reduce");
  }

  void all_gather_uneven(const at::Tensor& in, at::Tensor& out, const std::vector<int64_t>& counts) override {
    device_tensor(in);
    device_tensor(out);
    const size_t element = in.element_size();
    auto* base = static_cast<char*>(out.data_ptr());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    size_t offset = 0;
    for (int r = 0; r < size_; ++r) {
      const size_t bytes = counts[r] * element;
      const void* send = r == rank_ ? in.data_ptr() : base + offset;
      enqueued(ncclBroadcast(send, base + offset, bytes, ncclUint8, r, comm_, stream_), "ncclBroadcast");
      offset += bytes;
    }
    enqueued(ncclGroupEnd(), "ncclGroupEnd");
    sync("all_gather_uneven");
  }

  void broadcast(at::Tensor& t, int root) override {
    device_tensor(t);
    enqueued(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, stream_),
             "ncclBroadcast");
    sync("broadcast");
  }

  void all_to_all(const at::Tensor& in, at::Tensor& out) override {
    device_tensor(in);
    device_tensor(out);
    const size_t chunk_bytes = in.numel() / size_ * in.element_size();
    auto* send = static_cast<const char*>(in.data_ptr());
    auto* recv = static_cast<char*>(out.data_ptr());
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < size_; ++r) {
      enqueued(ncclSend(send + r * chunk_bytes, chunk_bytes, ncclUint8, r, comm_, stream_), "ncclSend");
      enqueued(ncclRecv(recv + r * chunk_bytes, chunk_bytes, ncclUint8, r, comm_, stream_), "ncclRecv");
    }
    enqueued(ncclGroupEnd(), "ncclGroupEnd");
    sync("all_to_all");
  }

  void send(const at::Tensor& t, int dst, uint32_t) override {
    device_tensor(t);
    enqueued(ncclSend(t.data_ptr(), t.numel(), nccl_type(t), dst, comm_, stream_), "ncclSend");
    sync("send");
  }

  void recv(at::Tensor& t, int src, uint32_t) override {
    device_tensor(t);
    enqueued(ncclRecv(t.data_ptr(), t.numel(), nccl_type(t), src, comm_, stream_), "ncclRecv");
    sync("recv");
  }

  void barrier() override {
    enqueued(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce(barrier)");
    sync("barrier");
  }

  std::unique_ptr<Backend> make_group(std::shared_ptr<Store> store, int rank, int size,
                                      const CommunicatorOptions& options) override {
    return std::make_unique<NcclBackend>(std::move(store), rank, size, device_, options);
  }

 private:
  void device_tensor(const at::Tensor& t) const {
    if (!t.is_cuda())
      throw TransportError("NCCL communicator: tensors must be on a CUDA device, got " + t.device().str());
  }

  // The answer of a call on the non-blocking communicator: ncclInProgress is polled until the
  // call completed (or the timeout passed), any other error is thrown.
  void enqueued(ncclResult_t r, const char* what) {
    if (r == ncclInProgress) {
      poll(what, [] { return true; });
    } else if (r != ncclSuccess) {
      const std::string detail = comm_ ? ncclGetLastError(comm_) : "";
      throw TransportError(std::string("NCCL ") + what + " failed: " + ncclGetErrorString(r) +
                           (detail.empty() ? "" : " (" + detail + ")"));
    }
  }

  // Waits for the stream, polling so that a missing peer becomes a timeout instead of a hang.
  void sync(const char* op) {
    poll(op, [&] {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e != cudaSuccess && e != cudaErrorNotReady) check_cuda(e, op);
      return e == cudaSuccess;
    });
  }

  // Polls until the communicator has nothing in progress and `done()` holds; an asynchronous NCCL
  // error or the timeout aborts the communicator and throws.
  template <typename Done>
  void poll(const char* op, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string detail = ncclGetLastError(comm_);
        abort_communicator();
        throw TransportError(std::string("NCCL ") + op + " failed: " + ncclGetErrorString(async) + " (" +
                             (detail.empty() ? "a peer was lost or a connection closed" : detail) + ")");
      }
      if (async == ncclSuccess && done()) return;
      if (std::chrono::steady_clock::now() > deadline) {
        abort_communicator();
        throw TransportError(std::string("NCCL ") + op + " timed out after " + std::to_string(timeout_.count()) +
                             " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  void abort_communicator() {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  std::string name_ = "nccl";
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* scratch_ = nullptr;
  cudaEvent_t producer_done_ = nullptr;
};

}  // namespace

std::unique_ptr<Backend> make_nccl_backend(std::shared_ptr<Store> store, int rank, int size, int device,
                                           const CommunicatorOptions& options) {
  return std::make_unique<NcclBackend>(std::move(store), rank, size, device, options);
}

}  // namespace tessera::transport
