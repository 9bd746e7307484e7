// The messages of tessera's actors, in one place so the protocol reads top to bottom. Every actor
// owns its state; what another needs it gets in a message, and a buffer it lends comes back (or
// stops being used) at a point the protocol fixes. Messages carry handles and small descriptors,
// never copies of buffers. Errors travel as std::exception_ptr inside the reply, so the user's
// thread rethrows the original tessera::Error (a TimeoutError stays a TimeoutError). All types are
// local to one process.
//
// gradient-reducer (owns the gradient buffers; the only issuer on the gradient communicator)
//   <- begin                     a backward whose gradients must be reduced starts
//   <- ready(i)                  stages 0/1: parameter i's gradient is final for this backward
//   <- bucket(StagedBucket)      partitioned gradients: a filled bucket (its staging slot is lent)
//   <- chunk(StagedChunk)        ZeRO-3: a chunk of a segment's staged gradients, reduce-scattered
//                                into this rank's partition (its staging slot is lent)
//   <- flush                     backward ended: issue every bucket not issued yet
//   <- reclaim                   the staging needs a slot: issue what arrived, finish the oldest
//   <- fold -> Done              fp32 accumulation: fold this backward's gradients (no reduction)
//   <- finish(FinishRequest) -> GradientsReady   wait, unscale, overflow check, clip; the
//                                gradient partitions are lent to the optimizer until `zero`
//   <- zero -> Done              wait for everything issued, zero the gradients
//   <- memory -> int64_t         bytes of gradients held (buffers, staging, .grad)
//   <- next_final -> FinalGradients   stages 2/3: the next sub-group of this rank's partition whose
//                                gradients are final in this backward (replied when there is one)
//   <- settle -> Done            wait for everything issued; every sub-group is final now
// parameter-shard (owns the flat parameter buffers; the only issuer on the parameter communicator)
//   <- partitions -> Buffers     this rank's partitions, lent to the optimizer until `gather` (on
//                                NVMe: the swap they are in, read and written range by range)
//   <- gather -> Done            all-gather the updated partitions into every rank's buffers
//   <- buffers(BufferContents) -> Buffers   the whole flat buffers (storage maps; between steps),
//                                or only their sizes and counters (memory, stats: nothing paged in)
//   <- fetch(FetchRequest) -> Done   ZeRO-3: gather the unit (all-gather of its segments) if
//                                released. The kind says why: a gathered-parameters scope's
//                                (outside the module order, exact values), a forward's without
//                                grad (in the order; in training nothing is prefetched after it:
//                                no backward follows), a forward's with grad or a backward's (in
//                                the order; the next recorded units are gathered ahead after the
//                                reply). `autocast`: a forward under CPU autocast.
//   <- release(ReleaseRequest)   ZeRO-3: free a unit's storage now, or after a use (kept if the
//                                record uses it again soon); or every unit's
//   <- window(WindowEdge)        ZeRO inference: an Engine::forward begins or ends (a prefetch window)
//   <- writeback(WritebackRequest) -> Done  ZeRO-3: broadcast the gathered units (and, if asked,
//                                the persistent segments) from the modifier rank, then copy this
//                                rank's pieces into the partitions (a gathered-parameters scope
//                                with a modifier rank); without a modifier rank only gather the
//                                persistent segments again from the partitions
// optimizer-shard (owns masters and optimizer states through its state store)
//   <- step(StepRequest) -> StepReport   finish -> partitions -> update -> gather + zero
//   <- states -> OptimizerStates         masters and states (storage maps, memory; between steps)
//   <- refresh(RefreshRequest) -> Done  the fp32 masters := the parameters' partitions over
//                                        those ranges (after a write-back)
//   <- early(StepRequest)                optimizer offload, update during backward: the boundary
//                                        backward started; update each sub-group the reducer
//                                        names final (next_final) until every one is; step()
//                                        then writes the weights back
// offload (owns the host staging buffers of optimizer offload; moves one sub-group at a time
// between the device and the host, in the order asked, on its own thread)
//   <- to_host(GradientsToHost) -> HostGradients   copy a sub-group's reduced gradients into a
//                                host slot, lent until the request that names the slot again
//   <- to_device(WeightsToDevice) -> Done          round the updated host master into the
//                                parameters' dtype in a host slot and copy it into the device's
//                                parameter partition
// The rollout-sink's messages are in actors/rollout/sink_protocol.h, above this layer.
#pragma once

#include <ATen/core/Tensor.h>
#include <caf/all.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "actors/offload_state.h"
#include "core/optim/optimizer_kernel.h"
#include "core/zero/parked_storage.h"

namespace tessera::zero {
class ParameterSwap;
}  // namespace tessera::zero

namespace tessera::actors {

using begin_atom = caf::atom_constant<caf::atom("begin")>;
using ready_atom = caf::atom_constant<caf::atom("ready")>;
using bucket_atom = caf::atom_constant<caf::atom("bucket")>;
using flush_atom = caf::atom_constant<caf::atom("flush")>;
using reclaim_atom = caf::atom_constant<caf::atom("reclaim")>;
using fold_atom = caf::atom_constant<caf::atom("fold")>;
using finish_atom = caf::atom_constant<caf::atom("finish")>;
using zero_atom = caf::atom_constant<caf::atom("zero")>;
using memory_atom = caf::atom_constant<caf::atom("memory")>;
using poll_atom = caf::atom_constant<caf::atom("poll")>;
using partitions_atom = caf::atom_constant<caf::atom("parts")>;
using gather_atom = caf::atom_constant<caf::atom("gather")>;
using buffers_atom = caf::atom_constant<caf::atom("buffers")>;
using step_atom = caf::atom_constant<caf::atom("step")>;
using states_atom = caf::atom_constant<caf::atom("states")>;
using fetch_atom = caf::atom_constant<caf::atom("fetch")>;
using release_atom = caf::atom_constant<caf::atom("release")>;
using chunk_atom = caf::atom_constant<caf::atom("chunk")>;
using writeback_atom = caf::atom_constant<caf::atom("writeback")>;
using refresh_atom = caf::atom_constant<caf::atom("refresh")>;
using window_atom = caf::atom_constant<caf::atom("window")>;
using restore_atom = caf::atom_constant<caf::atom("restore")>;
using to_host_atom = caf::atom_constant<caf::atom("to_host")>;
using to_device_atom = caf::atom_constant<caf::atom("to_device")>;
using park_atom = caf::atom_constant<caf::atom("park")>;
using unpark_atom = caf::atom_constant<caf::atom("unpark")>;
using next_final_atom = caf::atom_constant<caf::atom("nextfinal")>;
using settle_atom = caf::atom_constant<caf::atom("settle")>;
using early_atom = caf::atom_constant<caf::atom("early")>;

// ZeRO-3: why a unit is fetched (fetch above). The order indexes Stage3Counters::by_kind.
enum class FetchKind : uint8_t {
  scope,            // a gathered-parameters scope: outside the module order, exact values
  forward_no_grad,  // a forward without grad
  forward,          // a forward with grad
  backward,         // before the unit's backward: bf16 only if its last forward was under autocast
};
inline constexpr size_t kFetchKinds = 4;

// A forward under CPU autocast: with torch_autocast the lower-precision-safe groups may be
// gathered in bf16 (the values autocast's own cast gives).
enum class Autocast : uint8_t { off, on };

struct FetchRequest {
  int64_t unit = -1;
  FetchKind kind = FetchKind::scope;
  Autocast autocast = Autocast::off;  // forwards only
};

enum class ReleaseKind : uint8_t {
  now,        // free the storage
  after_use,  // a forward or backward is done with it: kept if the record uses it again soon
};

struct ReleaseRequest {
  static constexpr int64_t kEveryUnit = -1;
  int64_t unit = kEveryUnit;
  ReleaseKind kind = ReleaseKind::now;
};

enum class WindowEdge : uint8_t { begin, end };

enum class PersistentCopies : uint8_t { skip, include };

struct WritebackRequest {
  static constexpr int kNoModifier = -1;
  std::vector<int64_t> units;  // gathered units, ascending
  PersistentCopies persistent = PersistentCopies::skip;
  int modifier_rank = kNoModifier;  // kNoModifier: nothing is broadcast; the persistent copies are
                                    // gathered again from the partitions
};

// The fp32 masters to take from the parameters: ranges of flat groups' partitions
// (partition-relative elements).
struct MasterRange {
  int64_t group = 0;
  int64_t begin = 0;
  int64_t length = 0;
};
struct RefreshRequest {
  std::vector<MasterRange> ranges;
};

// A reply that carries only success or the error.
struct Done {
  std::exception_ptr error;
};

// A filled reduce-to-owner bucket: `data` (bucket.elements() elements of the bucket's comm dtype)
// is a view of staging slot `slot`, lent to the reducer until it gives the slot back.
struct StagedBucket {
  size_t bucket = 0;
  int slot = -1;
  at::Tensor data;
};

// ZeRO-3: a chunk of one segment's gradients, reduce-scattered into elements [begin, begin +
// length) of this rank's piece of the segment. `data` holds, for each rank r in turn, the length
// elements at r's piece offset + begin of the gathered segment (padding zero); `piece` receives
// this rank's reduced elements. Both are views of staging slot `slot` (unit_grad_staging.h), lent
// to the reducer until it gives the slot back.
struct StagedChunk {
  int64_t segment = 0;  // the plan's segment
  int64_t begin = 0;
  int64_t length = 0;
  int slot = -1;
  at::Tensor data;
  at::Tensor piece;
};

struct FinishRequest {
  double loss_scale = 1.0;     // gradients are divided by it before anything else (fp16)
  double max_grad_norm = 0.0;  // 0 = no clipping
};

struct GradientsReady {
  // Per flat group: this rank's gradient partition as the optimizer steps it (fp32 when there is
  // an fp32 master), averaged, unscaled and clipped. Lent until `zero`.
  std::vector<at::Tensor> partitions;
  double grad_norm = -1.0;       // global L2 norm of the averaged gradients (-1: not computed)
  bool overflow = false;         // fp16: a gradient was inf/NaN on some rank; update nothing
  double reduction_wait_s = 0;   // waiting for reductions still running when finish arrived
  std::exception_ptr error;
};

// ZeRO-3: fetch requests, and of them the ones whose unit was already on its way (gathered
// ahead) or still gathered (nothing to do).
struct FetchCounts {
  int64_t fetches = 0;
  int64_t prefetched = 0;
  int64_t already_gathered = 0;
};

// ZeRO-3: what the parameter-shard did since it started.
struct Stage3Counters {
  std::array<FetchCounts, kFetchKinds> by_kind;  // indexed by FetchKind
  FetchCounts total() const {  // every kind together
    FetchCounts t;
    for (const auto& k : by_kind)
      t.fetches += k.fetches, t.prefetched += k.prefetched, t.already_gathered += k.already_gathered;
    return t;
  }
  int64_t prefetch_issued = 0;   // gathers issued ahead of a request
  int64_t divergences = 0;       // windows that left the recorded order
  int64_t kept_for_reuse = 0;    // releases skipped: the unit is used again within stage3_max_reuse_distance
  int64_t peak_gathered_bytes = 0;  // most unit storage gathered at once (persistent copies not included)
  int64_t gathered_wire_bytes = 0;  // of every gather, the whole gathered segments in their wire dtype
};

// What a buffers request wants: the tensors (parameters on NVMe: paged in, lent until the next
// gather), or their sizes and counters only.
enum class BufferContents : uint8_t { sizes, tensors };

struct Buffers {
  std::vector<at::Tensor> tensors;  // per flat group (BufferContents::tensors; partitions unless swapped)
  std::shared_ptr<zero::ParameterSwap> swap;  // partitions on NVMe: read and written through it (PartitionWeights)
  int64_t weight_bytes = 0;         // the weight buffers' bytes in memory now (device, or host with parameter offload)
  int64_t swap_buffer_bytes = 0;    // parameters on NVMe: the swap's host buffers
  int64_t swap_file_bytes = 0;      // parameters on NVMe: the swap file
  int64_t gathered_bytes = 0;       // ZeRO-3: storage of the units gathered right now
  Stage3Counters stage3;
  std::exception_ptr error;
};

// A sub-group of this rank's partition whose gradients are final in this backward (stages 2/3,
// update during backward): `gradients` is its range of the partition the optimizer steps (fp32
// when there is an fp32 master), lent until `zero`.
struct FinalGradients {
  int64_t group = 0;
  int64_t sub = 0;
  at::Tensor gradients;
  bool at_settle = false;  // final only when every reduction had finished (settle), not during backward
  std::exception_ptr error;
};

struct StepRequest {
  std::vector<optim::StepHyperparameters> hyperparameters;  // per parameter group
  double max_grad_norm = 0.0;  // 0 = no clipping
  double loss_scale = 1.0;     // fp16
};

// Optimizer offload to NVMe, one step: the swap file's I/O and how much of it updates hid.
struct SwapStepStats {
  int64_t bytes_read = 0;
  int64_t bytes_written = 0;
  int64_t prefetched = 0;     // sub-groups whose record was read ahead (or still in memory)
  int64_t waited_reads = 0;   // sub-groups the update had to wait to read
  double read_wait_s = 0;     // waiting for reads not hidden by updates
  double write_wait_s = 0;    // waiting for writes to free a buffer
};

struct StepReport {
  double grad_norm = -1.0;
  bool overflow = false;
  double reduction_wait_s = 0;  // waiting for reductions still running when step() began
  double update_s = 0;          // unscale, clip and optimizer update
  double gather_s = 0;          // all-gather of the updated partitions
  double offload_wait_s = 0;    // optimizer offload: waiting for gradients to reach the host (not hidden by updates)
  double offload_copy_s = 0;    // optimizer offload: device<->host copies (hidden or not)
  SwapStepStats swap;           // optimizer offload to NVMe
  int64_t final_before_step = 0;  // update during backward: sub-groups final before step() (updated early)
  // Sub-groups whose master and states this step moved on, of all this rank has: also with an
  // error, so that a step that failed part-way is known as one (nothing can go on from it).
  int64_t sub_groups_updated = 0;
  int64_t sub_groups = 0;
  std::exception_ptr error;
};

struct OptimizerStates {
  std::vector<std::vector<std::string>> state_names;  // per flat group (its kernel's)
  std::vector<at::Tensor> masters;              // per flat group (undefined: the weights are the master)
  std::vector<std::vector<at::Tensor>> states;  // per flat group, in its state_names order
  int64_t master_bytes = 0;                     // beside the parameters
  int64_t state_bytes = 0;                      // every state beside the parameters
  int64_t host_master_bytes = 0;                // optimizer offload: in host memory (ratio < 1: part)
  int64_t host_state_bytes = 0;
  int64_t workspace_bytes = 0;                  // the kernels' reusable temporaries (optim::Workspace)
  bool host = false;                            // optimizer offload: the staging and the workspace in host memory
  int64_t staging_bytes = 0;                    // optimizer offload: the host staging slots
  int64_t swap_buffer_bytes = 0;                // optimizer offload to NVMe: the records' host buffers
  int64_t swap_file_bytes = 0;                  // optimizer offload to NVMe: the swap file
  int64_t updates = 0;                          // optimizer steps taken (bias corrections count them)
  std::exception_ptr error;
};

// A checkpoint's optimizer counters, restored between steps (the states themselves are written
// into the buffers OptimizerStates lends).
struct OptimizerCounters {
  int64_t updates = 0;
};

// Optimizer offload: a sub-group's gradients, a view of the device's reduced partition, to slot
// `slot` of the host staging.
struct GradientsToHost {
  int64_t slot = 0;
  at::Tensor device;
};

struct HostGradients {
  at::Tensor host;  // the slot's first device.numel() elements, same dtype
  double copy_s = 0;
  std::exception_ptr error;
};

// Optimizer offload: a sub-group's new weights, from the host master to the device's partition.
struct WeightsToDevice {
  int64_t slot = 0;
  at::Tensor host_master;  // read only; unchanged until the reply
  at::Tensor device;       // the parameter partition's view, in the parameters' dtype
};

// What the gradient-reducer holds: gradients (flat buffers, accumulators, reduced partitions,
// staging, deferred .grad) and scratch (the clipping norm's double buffer).
struct ReducerMemory {
  int64_t gradients = 0;
  int64_t scratch = 0;
};

// offload_states/reload_states: which of its buffers each actor moves to host memory (ParkRequest,
// ignoring the kinds it does not own) and brings back (unpark_atom): the parameter-shard the
// parameters, the gradient-reducer the gradients, the optimizer-shard the masters and states.
using StateKind = OffloadState;

struct ParkRequest {
  std::vector<StateKind> kinds;
  zero::HostMemory host = zero::HostMemory::pageable;
  bool asks(StateKind k) const { return std::find(kinds.begin(), kinds.end(), k) != kinds.end(); }
};

struct Parked {
  int64_t bytes = 0;  // moved by this request
  std::exception_ptr error;
};

using gradient_reducer_actor = caf::typed_actor<
    caf::reacts_to<begin_atom>, caf::reacts_to<ready_atom, int64_t>, caf::reacts_to<bucket_atom, StagedBucket>,
    caf::reacts_to<chunk_atom, StagedChunk>,
    caf::reacts_to<flush_atom>, caf::reacts_to<reclaim_atom>, caf::reacts_to<poll_atom>,
    caf::replies_to<fold_atom>::with<Done>, caf::replies_to<finish_atom, FinishRequest>::with<GradientsReady>,
    caf::replies_to<zero_atom>::with<Done>, caf::replies_to<memory_atom>::with<ReducerMemory>,
    caf::replies_to<park_atom, ParkRequest>::with<Parked>, caf::replies_to<unpark_atom>::with<Parked>,
    caf::replies_to<next_final_atom>::with<FinalGradients>, caf::replies_to<settle_atom>::with<Done>>;

using parameter_shard_actor =
    caf::typed_actor<caf::replies_to<partitions_atom>::with<Buffers>, caf::replies_to<gather_atom>::with<Done>,
                     caf::replies_to<buffers_atom, BufferContents>::with<Buffers>, caf::replies_to<fetch_atom, FetchRequest>::with<Done>,
                     caf::reacts_to<release_atom, ReleaseRequest>, caf::reacts_to<window_atom, WindowEdge>,
                     caf::replies_to<writeback_atom, WritebackRequest>::with<Done>,
                     caf::replies_to<park_atom, ParkRequest>::with<Parked>, caf::replies_to<unpark_atom>::with<Parked>>;

using offload_actor = caf::typed_actor<caf::replies_to<to_host_atom, GradientsToHost>::with<HostGradients>,
                                        caf::replies_to<to_device_atom, WeightsToDevice>::with<Done>>;

using optimizer_shard_actor = caf::typed_actor<caf::replies_to<step_atom, StepRequest>::with<StepReport>,
                                               caf::replies_to<states_atom>::with<OptimizerStates>,
                                               caf::replies_to<memory_atom>::with<OptimizerStates>,
                                               caf::replies_to<refresh_atom, RefreshRequest>::with<Done>,
                                               caf::replies_to<restore_atom, OptimizerCounters>::with<Done>,
                                               caf::replies_to<park_atom, ParkRequest>::with<Parked>,
                                               caf::replies_to<unpark_atom>::with<Parked>,
                                               caf::reacts_to<early_atom, StepRequest>>;

}  // namespace tessera::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::Done)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::ReducerMemory)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StagedBucket)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StagedChunk)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::FinishRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::GradientsReady)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::Buffers)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::BufferContents)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StepRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::StepReport)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::OptimizerStates)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::OptimizerCounters)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::FetchRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::ReleaseRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::WindowEdge)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::WritebackRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::RefreshRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::GradientsToHost)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::HostGradients)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::WeightsToDevice)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::ParkRequest)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::Parked)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(tessera::actors::FinalGradients)
