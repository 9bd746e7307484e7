// A Communicator is one group of ranks that run collectives together over flat tensors.
//
// The whole job is one communicator ("world"); sub-groups (data-, tensor-, expert-parallel) are
// made from rank lists with `group()`, and a rank may belong to several. Every operation takes
// flat (1-D, contiguous) CPU tensors for Gloo, CUDA tensors for NCCL, and returns a Work handle
// right away; the data moves on the communicator's own thread.
//
// Cross-rank contract (docs/DESIGN.md §7.2, §7.3): every member must issue the same operations on a
// communicator in the same order, with matching sizes and dtypes. Each communicator owns ONE
// sequencer: calls from any thread or actor get the next sequence number when they are issued,
// and run strictly in that order. A rank that has been waiting in operation #n for a while
// (min(1 s, timeout/4); fast operations cost nothing) records "waiting in #n" in the store; when
// an operation does not finish within its timeout, `Work::wait` throws
// tessera::TimeoutError naming the communicator, the operation, #n and the ranks that never
// arrived — never a silent hang. After a timeout or a lost peer the communicator is broken: every
// later operation fails at once with the first error.
//
// Semantics (size = number of members, r = this member's index in the group):
//   all_reduce(t, op)            t := op over members of t (sum, avg, max).
//   reduce_scatter(in, out, op)  in has size*k elements, out k: out := chunk r of op(in).
//   all_gather(in, out)          out (size*k) := concat of every member's in (k).
//   all_gather_in_place(buf)     buf (size*k): chunk i := member i's chunk i (no copy of the input).
//   all_gather_uneven(in,out,c)  member i contributes c[i] elements; out = concat, sum(c) long.
//   reduce(t, root, op)          root's t := op over members of t; the others' t is left
//                                unspecified (scratch): it is where the reduction ran.
//   broadcast(t, root)           t := root's t.
//   all_to_all(in, out)          in and out size*k: out chunk i := member i's in chunk r.
//   send(t, dst, tag)/recv(t, src, tag)  point to point; in program order like the rest.
//   barrier()                    returns when every member has reached it.
// bf16 and fp16 on Gloo (which has no bf16): reductions run in fp32 on the upcast values and
// the result is rounded back once, bitwise what reducing the fp32 upcasts and casting gives.
// Non-reducing operations move bytes, so any dtype works.
//
// Example: 4 ranks, t = full({3}, rank+1.f): all_reduce(t)->wait() gives {10,10,10} everywhere;
// in = arange(8)+rank, out = empty(2): reduce_scatter(in, out) gives on rank 1 {4*2+6, 4*3+6}.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/config/config.h"  // the defaults of [tessera.transport] / [tessera.rollout], written once there

namespace tessera::transport {

class Store;
class Backend;
class Sequencer;
class ArrivalRecorder;

enum class ReduceOp { sum, avg, max };

struct CommunicatorOptions {
  // Name in the store and in errors ("world", "dp0", ...). Unique per job.
  std::string name = "world";
  // Default timeout of every operation and of the backend's own waits (Gloo pairs).
  std::chrono::milliseconds timeout{config::TransportConfig{}.collective_timeout_ms};
  // Gloo: the address the pairs listen on; "" = GLOO_SOCKET_IFNAME's interface when set, else the
  // local address facing MASTER_ADDR (loopback on one node), so that ranks on other nodes reach it.
  std::string gloo_hostname;
  // Gloo: threads of c10d's process group.
  int gloo_threads = 2;
};

// Per-operation options. timeout 0 = the communicator's.
struct OpOptions {
  std::chrono::milliseconds timeout{0};
  // NCCL: the CUDA stream (a cudaStream_t) whose work produced the inputs; the operation's
  // stream waits for it first. nullptr: the legacy default stream (LibTorch's default current
  // stream). Gloo ignores it.
  void* cuda_stream = nullptr;
  // Run on the communicator's thread just before the operation (after every earlier one finished):
  // a non-empty answer fails the operation with it, nothing sent. For a check on what an earlier
  // operation delivered to every member (ZeRO-3's gather headers), so that all members skip alike
  // instead of exchanging buffers of different sizes. Empty: no check.
  std::function<std::string()> precondition;
};
struct ReduceOptions : OpOptions {
  ReduceOp op = ReduceOp::sum;
};

// A handle on an issued operation.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the operation completed (returns) or failed (throws its error), or until
  // `timeout` (0 = the operation's) passed: then throws TimeoutError with the missing ranks.
  virtual void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) = 0;
  // Whether the operation finished (successfully or not).
  virtual bool done() const = 0;
  // The operation's place in its communicator's program order (1, 2, ...).
  virtual uint64_t sequence() const = 0;
};

class Communicator {
 public:
  // A Gloo communicator of `size` ranks. Collective: every rank calls it with the same name.
  static std::shared_ptr<Communicator> gloo(std::shared_ptr<Store> store, int rank, int size,
                                            const CommunicatorOptions& options = {});
  // An NCCL communicator (needs a build with TESSERA_WITH_CUDA and a GPU per rank).
  static std::shared_ptr<Communicator> nccl(std::shared_ptr<Store> store, int rank, int size, int device,
                                            const CommunicatorOptions& options = {});

  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  const std::string& backend_name() const;
  // The ranks of the root communicator (the job) that form this one, by index.
  const std::vector<int>& job_ranks() const { return job_ranks_; }

  // A sub-group of this communicator's ranks (indices into this communicator), same backend.
  // Collective over the members only; non-members get nullptr without talking to anyone.
  // Every member must create its groups in the same order. `name` defaults to "<this>.g<r0>_<r1>..";
  // `timeout` (every operation's and the backend's waits) defaults to this communicator's.
  std::shared_ptr<Communicator> group(const std::vector<int>& ranks, const std::string& name = "",
                                      std::optional<std::chrono::milliseconds> timeout = std::nullopt);

  std::shared_ptr<Work> all_reduce(at::Tensor tensor, const ReduceOptions& options = {});
  std::shared_ptr<Work> reduce_scatter(at::Tensor input, at::Tensor output, const ReduceOptions& options = {});
  std::shared_ptr<Work> all_gather(at::Tensor input, at::Tensor output, const OpOptions& options = {});
  std::shared_ptr<Work> all_gather_in_place(at::Tensor buffer, const OpOptions& options = {});
  std::shared_ptr<Work> reduce(at::Tensor tensor, int root, const ReduceOptions& options = {});
  std::shared_ptr<Work> all_gather_uneven(at::Tensor input, at::Tensor output, std::vector<int64_t> counts,
                                          const OpOptions& options = {});
  std::shared_ptr<Work> broadcast(at::Tensor tensor, int root, const OpOptions& options = {});
  std::shared_ptr<Work> all_to_all(at::Tensor input, at::Tensor output, const OpOptions& options = {});
  std::shared_ptr<Work> send(at::Tensor tensor, int dst, uint32_t tag = 0, const OpOptions& options = {});
  std::shared_ptr<Work> recv(at::Tensor tensor, int src, uint32_t tag = 0, const OpOptions& options = {});
  std::shared_ptr<Work> barrier(const OpOptions& options = {});

  // Built by the factories above.
  Communicator(std::shared_ptr<Store> store, std::unique_ptr<Backend> backend, int rank, int size,
               std::vector<int> job_ranks, const CommunicatorOptions& options);

 private:
  std::shared_ptr<Work> issue(const char* op, const OpOptions& options, std::vector<at::Tensor> keep,
                              std::function<void(Backend&)> run);
  void check_flat(const char* op, const at::Tensor& t, const char* what) const;
  std::string context() const;

  std::shared_ptr<Store> store_;  // scoped to "comm/<name>/"
  std::shared_ptr<Backend> backend_;
  std::shared_ptr<Sequencer> sequencer_;
  std::shared_ptr<ArrivalRecorder> recorder_;
  int rank_;
  int size_;
  std::vector<int> job_ranks_;
  CommunicatorOptions options_;
  std::shared_ptr<Store> root_store_;  // the store given to the factory (for groups)
  // Groups made so far per (name, member list): the members of one group count alike, whatever
  // other groups each of them belongs to.
  std::map<std::string, int> groups_made_;
};

}  // namespace tessera::transport
