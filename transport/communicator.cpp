#include "transport/communicator.h"

#include <c10/core/ScalarType.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "core/error.h"
#include "transport/detail/arrival_recorder.h"
#include "transport/detail/backend.h"
#include "transport/detail/sequencer.h"
#include "transport/liveness.h"
#include "transport/store.h"

namespace tessera::transport {
namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

// What every error of a communicator says about where it happened.
struct CommInfo {
  std::shared_ptr<Store> store;
  std::string name;
  std::string backend;
  int rank;
  int size;
  std::vector<int> job_ranks;

  std::string where() const {
    return "communicator '" + name + "' (" + backend + ", job '" + store->job() + "', rank " + std::to_string(rank) +
           " of " + std::to_string(size) + ")";
  }

  std::string member(int r) const {
    std::string s = "rank " + std::to_string(r);
    if (job_ranks[r] != r) s += " (job rank " + std::to_string(job_ranks[r]) + ")";
    return s;
  }

  // The members whose last recorded arrival is before `sequence`.
  std::string missing(uint64_t sequence) const {
    std::vector<std::string> missing;
    try {
      for (int r = 0; r < size; ++r) {
        std::string key = "arrived/" + std::to_string(r);
        uint64_t at = 0;
        if (store->check({key})) at = std::stoull(store->get_string(key, std::chrono::seconds(2)));
        if (at < sequence)
          missing.push_back(member(r) + (at ? " (last seen waiting in #" + std::to_string(at) + ")" : ""));
      }
    } catch (const std::exception& e) {
      return "unknown (store unreachable: " + first_line(e.what()) + ")";
    }
    if (missing.empty()) return "none (every rank arrived; a peer may have issued a different operation)";
    std::string s;
    for (const auto& m : missing) s += (s.empty() ? "" : ", ") + m;
    return s;
  }

  TimeoutError timeout_error(const std::string& op, uint64_t sequence, std::chrono::milliseconds t) const {
    return TimeoutError(where() + ": " + op + " #" + std::to_string(sequence) + " did not complete within " +
                        std::to_string(t.count()) + " ms; ranks that did not arrive: " + missing(sequence));
  }
};

class OpWork : public Work {
 public:
  OpWork(std::shared_ptr<OpState> state, std::shared_ptr<CommInfo> info, std::shared_ptr<Sequencer> sequencer)
      : state_(std::move(state)), info_(std::move(info)), sequencer_(std::move(sequencer)) {}

  void wait(std::chrono::milliseconds timeout) override {
    auto t = timeout.count() > 0 ? timeout : state_->timeout;
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->cv.wait_for(lock, t, [&] { return state_->done; })) {
      lock.unlock();
      auto error = std::make_exception_ptr(info_->timeout_error(state_->op, state_->sequence, t));
      sequencer_->break_with(error);
      std::rethrow_exception(error);
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }

  bool done() const override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done;
  }

  uint64_t sequence() const override { return state_->sequence; }

 private:
  std::shared_ptr<OpState> state_;
  std::shared_ptr<CommInfo> info_;
  std::shared_ptr<Sequencer> sequencer_;
};

}  // namespace

static std::shared_ptr<CommInfo> make_info(const std::shared_ptr<Store>& store, const std::string& name,
                                           const std::string& backend, int rank, int size,
                                           const std::vector<int>& job_ranks) {
  auto info = std::make_shared<CommInfo>();
  info->store = store;
  info->name = name;
  info->backend = backend;
  info->rank = rank;
  info->size = size;
  info->job_ranks = job_ranks;
  return info;
}

static std::vector<int> iota_ranks(int size) {
  std::vector<int> r(size);
  std::iota(r.begin(), r.end(), 0);
  return r;
}

static void check_world(const std::shared_ptr<Store>& store, int rank, int size, const CommunicatorOptions& o) {
  if (!store) throw TransportError("communicator '" + o.name + "': no store given");
  if (size < 1 || rank < 0 || rank >= size)
    throw TransportError("communicator '" + o.name + "' (job '" + store->job() + "'): rank " + std::to_string(rank) +
                         " is not in 0.." + std::to_string(size - 1));
  if (o.timeout.count() <= 0) throw TransportError("communicator '" + o.name + "': timeout must be > 0 ms");
}

std::shared_ptr<Communicator> Communicator::gloo(std::shared_ptr<Store> store, int rank, int size,
                                                 const CommunicatorOptions& options) {
  check_world(store, rank, size, options);
  auto scoped = store->scoped("comm")->scoped(options.name);
  auto backend = make_gloo_backend(scoped, rank, size, options);
  auto comm = std::make_shared<Communicator>(scoped, std::move(backend), rank, size, iota_ranks(size), options);
  comm->root_store_ = store;
  return comm;
}

std::shared_ptr<Communicator> Communicator::nccl(std::shared_ptr<Store> store, int rank, int size, int device,
                                                 const CommunicatorOptions& options) {
  check_world(store, rank, size, options);
  auto scoped = store->scoped("comm")->scoped(options.name);
  auto backend = make_nccl_backend(scoped, rank, size, device, options);
  auto comm = std::make_shared<Communicator>(scoped, std::move(backend), rank, size, iota_ranks(size), options);
  comm->root_store_ = store;
  return comm;
}

Communicator::Communicator(std::shared_ptr<Store> store, std::unique_ptr<Backend> backend, int rank, int size,
                           std::vector<int> job_ranks, const CommunicatorOptions& options)
    : store_(std::move(store)),
      backend_(std::move(backend)),
      sequencer_(std::make_shared<Sequencer>()),
      recorder_(std::make_shared<ArrivalRecorder>(store_, rank)),
      rank_(rank),
      size_(size),
      job_ranks_(std::move(job_ranks)),
      options_(options) {
  start_heartbeat();
}

Communicator::~Communicator() {
  // The sequencer finishes (or fails, bounded by the backend timeout) what was issued first.
  sequencer_.reset();
}

const std::string& Communicator::backend_name() const { return backend_->name(); }

std::string Communicator::context() const {
  return "communicator '" + options_.name + "' (" + backend_->name() + ", job '" + store_->job() + "', rank " +
         std::to_string(rank_) + " of " + std::to_string(size_) + ")";
}

std::shared_ptr<Communicator> Communicator::group(const std::vector<int>& ranks, const std::string& name,
                                                  std::optional<std::chrono::milliseconds> timeout) {
  std::vector<int> sorted = ranks;
  std::sort(sorted.begin(), sorted.end());
  if (sorted.empty() || std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end() || sorted.front() < 0 ||
      sorted.back() >= size_)
    throw TransportError(context() + ": group ranks must be distinct members 0.." + std::to_string(size_ - 1));
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) return nullptr;
  std::string members;  // "3_1_2", in the given order (it decides the group ranks)
  for (size_t i = 0; i < ranks.size(); ++i) members += (i ? "_" : "") + std::to_string(ranks[i]);
  CommunicatorOptions o = options_;
  o.name = name.empty() ? options_.name + ".g" + members : name;
  if (timeout) {
    if (timeout->count() <= 0) throw TransportError(context() + ": group '" + o.name + "': timeout must be > 0 ms");
    o.timeout = *timeout;
  }
  // The store key names the members, and counts only groups of that name and membership: a rank's
  // other groups (which its peers here may not share) must not shift it. The count keeps a group
  // made again with the same name and members apart.
  const std::string identity = o.name + "[" + members + "]";
  std::string key = identity + "#" + std::to_string(groups_made_[identity]++);
  auto scoped = store_->scoped("groups")->scoped(key);
  int group_rank = static_cast<int>(me - ranks.begin());
  auto backend = backend_->make_group(scoped, group_rank, static_cast<int>(ranks.size()), o);
  std::vector<int> job_ranks;
  for (int r : ranks) job_ranks.push_back(job_ranks_[r]);
  return std::make_shared<Communicator>(scoped, std::move(backend), group_rank, static_cast<int>(ranks.size()),
                                        std::move(job_ranks), o);
}

void Communicator::check_flat(const char* op, const at::Tensor& t, const char* what) const {
  if (!t.defined()) throw TransportError(context() + ": " + op + ": " + what + " is undefined");
  if (t.dim() != 1 || !t.is_contiguous())
    throw TransportError(context() + ": " + op + ": " + what + " must be a flat contiguous tensor, got " +
                         std::to_string(t.dim()) + "-d" + (t.is_contiguous() ? "" : " non-contiguous"));
}

std::shared_ptr<Work> Communicator::issue(const char* op, const OpOptions& options, std::vector<at::Tensor> keep,
                                          std::function<void(Backend&)> run) {
  auto state = std::make_shared<OpState>();
  state->op = op;
  state->timeout = options.timeout.count() > 0 ? options.timeout : options_.timeout;
  void* producer = options.cuda_stream;
  auto info = make_info(store_, options_.name, backend_->name(), rank_, size_, job_ranks_);
  auto backend = backend_;
  auto recorder = recorder_;
  sequencer_->issue(state, [info, backend, recorder, run = std::move(run), keep = std::move(keep),
                            op = std::string(op), t = state->timeout, producer,
                            precondition = options.precondition](uint64_t sequence) {
    if (precondition)
      if (const auto why = precondition(); !why.empty())
        throw Error(info->where() + ": " + op + " #" + std::to_string(sequence) + " not run: " + why);
    recorder->begin(sequence, t);
    RunningOperation running([&info, &op, sequence] { return info->where() + ": " + op + " #" + std::to_string(sequence); });
    struct End {
      ArrivalRecorder& r;
      ~End() { r.end(); }
    } end{*recorder};
    try {
      backend->wait_for_producer(producer);
      run(*backend);
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      std::string what = e.what();
      std::string head = info->where() + ": " + op + " #" + std::to_string(sequence);
      if (contains(what, "imed out") || contains(what, "imeout"))
        throw info->timeout_error(op, sequence, t);
      if (contains(what, "losed") || contains(what, "reset by peer") || contains(what, "roken pipe") ||
          contains(what, "EOF"))
        throw PeerLostError(head + ": a peer went away: " + first_line(what) + "; ranks that did not arrive: " +
                            info->missing(sequence));
      throw TransportError(head + " failed: " + first_line(what));
    }
  });
  return std::make_shared<OpWork>(state, info, sequencer_);
}

std::shared_ptr<Work> Communicator::all_reduce(at::Tensor tensor, const ReduceOptions& options) {
  check_flat("all_reduce", tensor, "tensor");
  if (options.op == ReduceOp::avg && !at::isFloatingType(tensor.scalar_type()))
    throw TransportError(context() + ": all_reduce: avg needs a floating-point tensor");
  auto op = options.op;
  return issue("all_reduce", options, {tensor}, [tensor, op](Backend& b) mutable { b.all_reduce(tensor, op); });
}

std::shared_ptr<Work> Communicator::reduce_scatter(at::Tensor input, at::Tensor output, const ReduceOptions& options) {
  check_flat("reduce_scatter", input, "input");
  check_flat("reduce_scatter", output, "output");
  if (input.numel() != output.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw TransportError(context() + ": reduce_scatter: input has " + std::to_string(input.numel()) +
                         " elements, output " + std::to_string(output.numel()) + "; need input = " +
                         std::to_string(size_) + " x output, same dtype");
  if (options.op == ReduceOp::avg && !at::isFloatingType(input.scalar_type()))
    throw TransportError(context() + ": reduce_scatter: avg needs a floating-point tensor");
  auto op = options.op;
  return issue("reduce_scatter", options, {input, output},
               [input, output, op](Backend& b) mutable { b.reduce_scatter(input, output, op); });
}

std::shared_ptr<Work> Communicator::all_gather(at::Tensor input, at::Tensor output, const OpOptions& options) {
  check_flat("all_gather", input, "input");
  check_flat("all_gather", output, "output");
  if (output.numel() != input.numel() * size_ || input.scalar_type() != output.scalar_type())
    throw TransportError(context() + ": all_gather: input has " + std::to_string(input.numel()) +
                         " elements, output " + std::to_string(output.numel()) + "; need output = " +
                         std::to_string(size_) + " x input, same dtype");
  return issue("all_gather", options, {input, output},
               [input, output](Backend& b) mutable { b.all_gather(input, output); });
}

std::shared_ptr<Work> Communicator::all_gather_in_place(at::Tensor buffer, const OpOptions& options) {
  check_flat("all_gather_in_place", buffer, "buffer");
  if (buffer.numel() % size_ != 0)
    throw TransportError(context() + ": all_gather_in_place: buffer has " + std::to_string(buffer.numel()) +
                         " elements, not a multiple of " + std::to_string(size_));
  return issue("all_gather_in_place", options, {buffer},
               [buffer](Backend& b) mutable { b.all_gather_in_place(buffer); });
}

std::shared_ptr<Work> Communicator::reduce(at::Tensor tensor, int root, const ReduceOptions& options) {
  check_flat("reduce", tensor, "tensor");
  if (root < 0 || root >= size_) throw TransportError(context() + ": reduce: root " + std::to_string(root) + " is not a member");
  if (options.op == ReduceOp::avg && !at::isFloatingType(tensor.scalar_type()))
    throw TransportError(context() + ": reduce: avg needs a floating-point tensor");
  auto op = options.op;
  return issue("reduce", options, {tensor}, [tensor, root, op](Backend& b) mutable { b.reduce(tensor, root, op); });
}

std::shared_ptr<Work> Communicator::all_gather_uneven(at::Tensor input, at::Tensor output, std::vector<int64_t> counts,
                                                      const OpOptions& options) {
  check_flat("all_gather_uneven", input, "input");
  check_flat("all_gather_uneven", output, "output");
  if (static_cast<int>(counts.size()) != size_)
    throw TransportError(context() + ": all_gather_uneven: " + std::to_string(counts.size()) +
                         " counts for " + std::to_string(size_) + " ranks");
  int64_t total = 0;
  for (auto c : counts) {
    if (c < 0) throw TransportError(context() + ": all_gather_uneven: negative count");
    total += c;
  }
  if (counts[rank_] != input.numel() || total != output.numel() || input.scalar_type() != output.scalar_type())
    throw TransportError(context() + ": all_gather_uneven: counts[" + std::to_string(rank_) + "] = " +
                         std::to_string(counts[rank_]) + " but input has " + std::to_string(input.numel()) +
                         "; counts sum to " + std::to_string(total) + " but output has " +
                         std::to_string(output.numel()));
  return issue("all_gather_uneven", options, {input, output},
               [input, output, counts](Backend& b) mutable { b.all_gather_uneven(input, output, counts); });
}

std::shared_ptr<Work> Communicator::broadcast(at::Tensor tensor, int root, const OpOptions& options) {
  check_flat("broadcast", tensor, "tensor");
  if (root < 0 || root >= size_) throw TransportError(context() + ": broadcast: root " + std::to_string(root) + " is not a member");
  return issue("broadcast", options, {tensor}, [tensor, root](Backend& b) mutable { b.broadcast(tensor, root); });
}

std::shared_ptr<Work> Communicator::all_to_all(at::Tensor input, at::Tensor output, const OpOptions& options) {
  check_flat("all_to_all", input, "input");
  check_flat("all_to_all", output, "output");
  if (input.numel() != output.numel() || input.numel() % size_ != 0 || input.scalar_type() != output.scalar_type())
    throw TransportError(context() + ": all_to_all: input and output need the same dtype and a multiple of " +
                         std::to_string(size_) + " elements, got " + std::to_string(input.numel()) + " and " +
                         std::to_string(output.numel()));
  return issue("all_to_all", options, {input, output},
               [input, output](Backend& b) mutable { b.all_to_all(input, output); });
}

std::shared_ptr<Work> Communicator::send(at::Tensor tensor, int dst, uint32_t tag, const OpOptions& options) {
  check_flat("send", tensor, "tensor");
  if (dst < 0 || dst >= size_ || dst == rank_)
    throw TransportError(context() + ": send: destination " + std::to_string(dst) + " is not another member");
  return issue("send", options, {tensor}, [tensor, dst, tag](Backend& b) { b.send(tensor, dst, tag); });
}

std::shared_ptr<Work> Communicator::recv(at::Tensor tensor, int src, uint32_t tag, const OpOptions& options) {
  check_flat("recv", tensor, "tensor");
  if (src < 0 || src >= size_ || src == rank_)
    throw TransportError(context() + ": recv: source " + std::to_string(src) + " is not another member");
  return issue("recv", options, {tensor}, [tensor, src, tag](Backend& b) mutable { b.recv(tensor, src, tag); });
}

std::shared_ptr<Work> Communicator::barrier(const OpOptions& options) {
  return issue("barrier", options, {}, [](Backend& b) { b.barrier(); });
}

#ifndef TESSERA_WITH_CUDA
std::unique_ptr<Backend> make_nccl_backend(std::shared_ptr<Store> store, int, int, int, const CommunicatorOptions& o) {
  throw TransportError("communicator '" + o.name + "' (job '" + store->job() +
                       "'): NCCL is not available: tessera was built without TESSERA_WITH_CUDA");
}
#endif

}  // namespace tessera::transport
