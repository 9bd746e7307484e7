// The Gloo backend of Communicator (CPU). c10d's ProcessGroupGloo runs broadcast, list all-gather,
// all-to-all, send/recv and barrier; the gloo library itself runs the collectives of the training
// hot path on this (the sequencer's) thread (all-reduce, reduce, in-place all-gather) and what c10d
// lacks in LibTorch 1.13 (reduce-scatter: gloo::alltoall and a local sum; uneven all-gather:
// gloo::allgatherv), over a second full mesh on the same device and store. bf16/fp16
// reductions run in fp32; byte-moving operations run on a uint8 view (Gloo has no bf16). An
// all-reduce of two members is tessera's own pipelined exchange over the same mesh
// (pair_all_reduce.h: bf16 travels as bf16, bitwise the ring's result); of more members two rounds
// of direct messages in the tensor's dtype (exchange_all_reduce.h: bitwise the ring for fp32).
// The pairs listen on CommunicatorOptions::gloo_hostname, or where other nodes can reach them
// (gloo_device below).
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/alltoall.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>

#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "core/launch_env.h"
#include "transport/detail/backend.h"
#include "transport/detail/c10d_store.h"
#include "transport/gloo/exchange_all_reduce.h"
#include "transport/gloo/pair_all_reduce.h"

namespace tessera::transport {
namespace {

bool is_half(const at::Tensor& t) { return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf; }

at::Tensor bytes(const at::Tensor& t) { return t.view(at::kByte); }

// The local address the kernel routes from towards `host` (a connected UDP socket sends nothing).
std::string address_facing(const std::string& host) {
  const std::string hint = " (set GLOO_SOCKET_IFNAME to the interface Gloo should use)";
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC, hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int rc = getaddrinfo(host.c_str(), "9", &hints, &found); rc != 0)
    throw TransportError("gloo: cannot resolve MASTER_ADDR '" + host + "': " + gai_strerror(rc) + hint);
  const int fd = socket(found->ai_family, SOCK_DGRAM, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof local;
  const bool ok = fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  char text[NI_MAXHOST];
  if (!ok || getnameinfo(reinterpret_cast<sockaddr*>(&local), length, text, sizeof text, nullptr, 0, NI_NUMERICHOST) != 0)
    throw TransportError("gloo: no local address routes to MASTER_ADDR '" + host + "'" + hint);
  return text;
}

// Where this rank's pairs listen: the options' hostname when given; else the interface that
// GLOO_SOCKET_IFNAME names (PyTorch's variable); else the local address facing MASTER_ADDR, which
// ranks on other nodes can reach (loopback when MASTER_ADDR is unset or loopback, as on one node).
std::shared_ptr<::gloo::transport::Device> gloo_device(const CommunicatorOptions& options) {
  if (!options.gloo_hostname.empty()) return c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname);
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  if (ifname && *ifname) return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  const std::string master = env_string("MASTER_ADDR", "");  // LaunchEnv's default would hide "unset"
  return c10d::ProcessGroupGloo::createDeviceForHostname(master.empty() ? "127.0.0.1" : address_facing(master));
}

class GlooBackend : public Backend {
 public:
  GlooBackend(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options)
      : rank_(rank), size_(size), timeout_(options.timeout) {
    auto opts = c10d::ProcessGroupGloo::Options::create(options.timeout);
    opts->devices.push_back(gloo_device(options));
    opts->threads = options.gloo_threads;
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c10d_store(*store, "pg"), rank, size, opts);
    context_ = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(options.timeout);
    c10d::ProcessGroupGloo::GlooStore gloo_store(c10d_store(*store, "gloo"));
    context_->connectFullMesh(gloo_store, opts->devices[0]);
    device_ = opts->devices[0];
  }

  const std::string& name() const override { return name_; }

  // Run on this thread (the pair or exchange all-reduce over the context's mesh): no
  // hand-off to c10d's worker threads and back, which costs two thread switches per bucket.
  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (tensor.numel() == 0) return;
    switch (tensor.scalar_type()) {
      case at::kFloat:
      case at::kBFloat16:
      case at::kHalf:
      case at::kDouble:
      case at::kLong:
      case at::kInt: return all_reduce_supported(tensor, op);
      default:
        throw TransportError(std::string("gloo all_reduce: dtype ") + c10::toString(tensor.scalar_type()) +
                             " not supported (float, bf16, fp16, double, int32, int64)");
    }
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    if (input.numel() == 0) return;
    switch (input.scalar_type()) {
      case at::kFloat:
      case at::kBFloat16:
      case at::kHalf:
        return reduce_scatter_as<float>(input, output, op, at::kFloat);
      case at::kDouble:
        return reduce_scatter_as<double>(input, output, op, at::kDouble);
      case at::kLong:
        return reduce_scatter_as<int64_t>(input, output, op, at::kLong);
      case at::kInt:
        return reduce_scatter_as<int32_t>(input, output, op, at::kInt);
      default:
        throw TransportError(std::string("gloo reduce_scatter: dtype ") + c10::toString(input.scalar_type()) +
                             " not supported (float, bf16, fp16, double, int32, int64)");
    }
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    if (input.numel() == 0) return;
    at::Tensor out = bytes(output);
    const int64_t n = input.numel() * input.element_size();
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(out.narrow(0, r * n, n));
    std::vector<at::Tensor> ins{bytes(input)};
    pg_->allgather(outs, ins)->wait();
  }

  void all_gather_in_place(at::Tensor& buffer) override {
    if (buffer.numel() == 0) return;
    at::Tensor out = bytes(buffer);
    gloo::AllgatherOptions o(context_);
    o.setOutput<uint8_t>(out.data_ptr<uint8_t>(), static_cast<size_t>(out.numel()));
    o.setTag(next_tag_++);
    o.setTimeout(timeout_);
    gloo::allgather(o);
  }

  void reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    if (tensor.numel() == 0) return;
    switch (tensor.scalar_type()) {
      case at::kFloat:
      case at::kBFloat16:
      case at::kHalf: return reduce_as<float>(tensor, root, op);
      case at::kDouble: return reduce_as<double>(tensor, root, op);
      case at::kLong: return reduce_as<int64_t>(tensor, root, op);
      case at::kInt: return reduce_as<int32_t>(tensor, root, op);
      default:
        throw TransportError(std::string("gloo reduce: dtype ") + c10::toString(tensor.scalar_type()) +
                             " not supported (float, bf16, fp16, double, int32, int64)");
    }
  }

  void all_gather_uneven(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& counts) override {
    if (output.numel() == 0) return;
    const size_t element = input.element_size();
    std::vector<size_t> byte_counts;
    for (auto c : counts) byte_counts.push_back(static_cast<size_t>(c) * element);
    uint8_t dummy = 0;
    auto* in = input.numel() ? static_cast<uint8_t*>(input.data_ptr()) : &dummy;
    gloo::AllgathervOptions o(context_);
    o.setInput<uint8_t>(in, byte_counts[rank_]);
    o.setOutput<uint8_t>(static_cast<uint8_t*>(output.data_ptr()), byte_counts);
    o.setTag(next_tag_++);
    o.setTimeout(timeout_);
    gloo::allgatherv(o);
  }

  void broadcast(at::Tensor& tensor, int root) override {
    if (tensor.numel() == 0) return;
    std::vector<at::Tensor> v{bytes(tensor)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    pg_->broadcast(v, o)->wait();
  }

  void all_to_all(const at::Tensor& input, at::Tensor& output) override {
    if (input.numel() == 0) return;
    at::Tensor in = bytes(input), out = bytes(output);
    std::vector<int64_t> equal;
    pg_->alltoall_base(out, in, equal, equal)->wait();
  }

  void send(const at::Tensor& tensor, int dst, uint32_t tag) override {
    if (tensor.numel() == 0) return;
    std::vector<at::Tensor> v{bytes(tensor)};
    pg_->send(v, dst, static_cast<int>(tag))->wait();
  }

  void recv(at::Tensor& tensor, int src, uint32_t tag) override {
    if (tensor.numel() == 0) return;
    std::vector<at::Tensor> v{bytes(tensor)};
    pg_->recv(v, src, static_cast<int>(tag))->wait();
  }

  void barrier() override { pg_->barrier()->wait(); }

  std::unique_ptr<Backend> make_group(std::shared_ptr<Store> store, int rank, int size,
                                      const CommunicatorOptions& options) override {
    return std::make_unique<GlooBackend>(std::move(store), rank, size, options);
  }

 private:
  // bf16/fp16 values upcast into the backend's fp32 scratch (grown, never shrunk: operations run
  // one at a time on the sequencer's thread, so one buffer serves all and nothing is allocated
  // per call in the steady state).
  at::Tensor upcast(const at::Tensor& t) {
    if (scratch_.numel() < t.numel()) scratch_ = at::empty({t.numel()}, t.options().dtype(at::kFloat));
    auto out = scratch_.narrow(0, 0, t.numel());
    out.copy_(t);
    return out;
  }

  // Two members: the pipelined pair exchange (pair_all_reduce.h), bitwise what the ring gives.
  // More: the exchange all-reduce (exchange_all_reduce.h): two rounds of direct messages in the
  // tensor's dtype; bitwise gloo's ring (as c10d's ProcessGroupGloo runs it) for fp32/double/ints,
  // member order in fp32 for bf16/fp16 (as reduce-scatter).
  void all_reduce_supported(at::Tensor& tensor, ReduceOp op) {
    if (size_ == 2) return pair_all_reduce(*context_, tensor, op, next_tag_++, timeout_, pair_scratch_);
    exchange_all_reduce(*context_, tensor, op, is_half(tensor) ? SumOrder::member : SumOrder::ring, next_tag_++,
                        timeout_, exchange_scratch_);
  }

  // gloo's ring reduce in place (the tensor itself, or its fp32 upcast); root divides for avg.
  template <typename T>
  void reduce_as(at::Tensor& tensor, int root, ReduceOp op) {
    at::Tensor work = is_half(tensor) ? upcast(tensor) : tensor;
    gloo::ReduceOptions o(context_);
    o.setOutput<T>(work.data_ptr<T>(), static_cast<size_t>(work.numel()));
    o.setRoot(root);
    using Fn = void (*)(void*, const void*, const void*, size_t);
    o.setReduceFunction(op == ReduceOp::max ? static_cast<Fn>(&gloo::max<T>) : static_cast<Fn>(&gloo::sum<T>));
    o.setTag(next_tag_++);
    o.setTimeout(timeout_);
    gloo::reduce(o);
    if (rank_ != root) return;
    if (op == ReduceOp::avg) work.div_(size_);
    if (!work.is_same(tensor)) tensor.copy_(work);
  }

  // Reduce-scatter as an exchange and a local sum: gloo::alltoall hands member j's chunk `rank_`
  // to this rank (it waits for its own sends too), then the chunks are summed here in member
  // order, so every rank adds the same operands in the same order ((c_0 + c_1) + c_2 ...; at two
  // ranks one commutative addition, bitwise what an all-reduce gives). Not Gloo's
  // ReduceScatterHalvingDoubling: its run() copies a rank's reduced chunk to the front of the
  // buffer it is still sending from, so a message larger than the socket buffers reaches the
  // peer overwritten (collectives_test "back-to-back 16 MiB reduce-scatters"). The exchange
  // buffer (and the upcast of a bf16/fp16 input) is the backend's, grown and never shrunk: one
  // operation at a time runs on the sequencer's thread.
  template <typename T>
  void reduce_scatter_as(const at::Tensor& input, at::Tensor& output, ReduceOp op, at::ScalarType type) {
    const int64_t chunk = output.numel();
    const at::Tensor in = input.scalar_type() == type ? input : upcast(input);
    if (size_ == 1) {  // its own input is the sum
      output.copy_(in);
      return;
    }
    if (!exchange_.defined() || exchange_.scalar_type() != type || exchange_.numel() < in.numel())
      exchange_ = at::empty({in.numel()}, in.options().dtype(type));
    at::Tensor received = exchange_.narrow(0, 0, in.numel());
    gloo::AlltoallOptions o(context_);
    o.setInput<T>(in.data_ptr<T>(), static_cast<size_t>(in.numel()));
    o.setOutput<T>(received.data_ptr<T>(), static_cast<size_t>(received.numel()));
    o.setTag(next_tag_++);
    o.setTimeout(timeout_);
    gloo::alltoall(o);
    at::Tensor result = output.scalar_type() == type ? output : received.narrow(0, 0, chunk);
    auto from = [&](int r) { return received.narrow(0, r * chunk, chunk); };
    if (op == ReduceOp::max) {
      at::maximum_out(result, from(0), from(1));
      for (int r = 2; r < size_; ++r) at::maximum_out(result, result, from(r));
    } else {
      at::add_out(result, from(0), from(1));
      for (int r = 2; r < size_; ++r) result.add_(from(r));
      if (op == ReduceOp::avg) result.div_(size_);
    }
    if (!result.is_same(output)) output.copy_(result);
  }

  at::Tensor scratch_;   // fp32, see upcast()
  at::Tensor exchange_;  // reduce_scatter's received chunks
  PairAllReduceScratch pair_scratch_;
  ExchangeAllReduceScratch exchange_scratch_;
  std::string name_ = "gloo";
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
  uint32_t next_tag_ = 1;
};

}  // namespace

// Gloo writes to its peers with writev, which raises SIGPIPE once a peer is gone: the rank would
// die of the signal instead of reporting PeerLostError (transport.collectives.peer_lost, now and
// then under load). Ignored unless the program installed a handler of its own.
static void ignore_sigpipe_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGPIPE, SIG_IGN);
  });
}

std::unique_ptr<Backend> make_gloo_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const CommunicatorOptions& options) {
  ignore_sigpipe_once();
  try {
    return std::make_unique<GlooBackend>(std::move(store), rank, size, options);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::string msg = "communicator '" + options.name + "' (gloo, rank " + std::to_string(rank) + " of " +
                      std::to_string(size) + "): connecting the ranks failed: " + what.substr(0, what.find('\n'));
    if (what.find("imeout") != std::string::npos || what.find("imed out") != std::string::npos)
      throw TimeoutError(msg);
    throw TransportError(msg);
  }
}

}  // namespace tessera::transport
