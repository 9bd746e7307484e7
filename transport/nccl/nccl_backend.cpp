// The NCCL backend of Communicator (GPU; built only with TESSERA_WITH_CUDA). Rank 0 of the
// communicator creates the NCCL unique id and publishes it in the communicator's store scope;
// every member joins with ncclCommInitRank on its device. Operations are enqueued on one stream
// per communicator and waited for by polling (cudaStreamQuery) up to the communicator timeout;
// a timeout aborts the NCCL communicator (ncclCommAbort) and reports "timed out", which the
// Communicator turns into a TimeoutError with the missing ranks. send/recv ignore the tag (NCCL
// matches by program order per peer, which the sequencer already fixes).
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
    check_nccl(ncclCommInitRank(&comm_, size, id, rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    check_cuda(cudaEventCreateWithFlags(&producer_done_, cudaEventDisableTiming), "cudaEventCreate");
  }

  ~NcclBackend() override {
    if (producer_done_) cudaEventDestroy(producer_done_);
    if (scratch_) cudaFree(scratch_);
    if (stream_) cudaStreamDestroy(stream_);
    if (comm_) ncclCommDestroy(comm_);
  }

  const std::string& name() const override { return name_; }

  // The operation's stream (non-blocking, so it does not sync with the default stream by itself)
  // waits for what the producer's stream has enqueued so far: inputs are complete before NCCL
  // reads them. Outputs are complete when sync() returns.
  void wait_for_producer(void* producer) override {
    check_cuda(cudaEventRecord(producer_done_, static_cast<cudaStream_t>(producer)), "cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(stream_, producer_done_, 0), "cudaStreamWaitEvent");
  }

  void all_reduce(at::Tensor& t, ReduceOp op) override {
    device_tensor(t);
    check_nccl(ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), comm_, stream_),
               "ncclAllReduce");
    sync("all_reduce");
  }

  void reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    device_tensor(in);
    device_tensor(out);
    check_nccl(ncclReduceScatter(in.data_ptr(), out.data_ptr(), out.numel(), nccl_type(in), nccl_op(op), comm_,
                                 stream_),
               "ncclReduceScatter");
    sync("reduce_scatter");
  }

  void all_gather(const at::Tensor& in, at::Tensor& out) override {
    device_tensor(in);
    device_tensor(out);
    check_nccl(ncclAllGather(in.data_ptr(), out.data_ptr(), in.numel(), nccl_type(in), comm_, stream_),
               "ncclAllGather");
    sync("all_gather");
  }

  void all_gather_in_place(at::Tensor& buffer) override {
    device_tensor(buffer);
    const int64_t chunk = buffer.numel() / size_;
    auto* own = static_cast<char*>(buffer.data_ptr()) + rank_ * chunk * buffer.element_size();
    check_nccl(ncclAllGather(own, buffer.data_ptr(), chunk, nccl_type(buffer), comm_, stream_), "ncclAllGather");
    sync("all_gather_in_place");
  }

  void reduce(at::Tensor& t, int root, ReduceOp op) override {
    device_tensor(t);
    check_nccl(ncclReduce(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), nccl_op(op), root, comm_, stream_),
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
      check_nccl(ncclBroadcast(send, base + offset, bytes, ncclUint8, r, comm_, stream_), "ncclBroadcast");
      offset += bytes;
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    sync("all_gather_uneven");
  }

  void broadcast(at::Tensor& t, int root) override {
    device_tensor(t);
    check_nccl(ncclBroadcast(t.data_ptr(), t.data_ptr(), t.numel(), nccl_type(t), root, comm_, stream_),
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
      check_nccl(ncclSend(send + r * chunk_bytes, chunk_bytes, ncclUint8, r, comm_, stream_), "ncclSend");
      check_nccl(ncclRecv(recv + r * chunk_bytes, chunk_bytes, ncclUint8, r, comm_, stream_), "ncclRecv");
    }
    check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    sync("all_to_all");
  }

  void send(const at::Tensor& t, int dst, uint32_t) override {
    device_tensor(t);
    check_nccl(ncclSend(t.data_ptr(), t.numel(), nccl_type(t), dst, comm_, stream_), "ncclSend");
    sync("send");
  }

  void recv(at::Tensor& t, int src, uint32_t) override {
    device_tensor(t);
    check_nccl(ncclRecv(t.data_ptr(), t.numel(), nccl_type(t), src, comm_, stream_), "ncclRecv");
    sync("recv");
  }

  void barrier() override {
    check_nccl(ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce(barrier)");
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

  // Waits for the stream, polling so that a missing peer becomes a timeout instead of a hang.
  void sync(const char* op) {
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    for (;;) {
      cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) check_cuda(e, op);
      ncclResult_t async = ncclSuccess;
      check_nccl(ncclCommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TransportError(std::string("NCCL ") + op + " failed: " + ncclGetErrorString(async) +
                             " (connection closed or peer lost)");
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ncclCommAbort(comm_);
        comm_ = nullptr;
        throw TransportError(std::string("NCCL ") + op + " timed out after " + std::to_string(timeout_.count()) +
                             " ms");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
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
