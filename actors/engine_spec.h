// EngineSpec: the immutable facts every actor of one training engine needs: the sharding plan,
// dtypes, flags, this rank's place, the device and the timeout. Made once by initialize() and
// shared by handle; it holds sizes, flags and the (immutable) plan only, never a tensor anybody
// writes: every buffer has one owning actor (docs/DESIGN.md §7.1, ownership rule).
#pragma once

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <chrono>
#include <memory>

#include "actors/core_pool.h"
#include "actors/update_timing.h"
#include "core/io/uring_file.h"
#include "core/zero/sharding_plan.h"
#include "core/zero/weight_home.h"

namespace tessera::actors {

// Where the optimizer's fp32 masters and states live (zero_optimization.offload_optimizer.device).
enum class StatePlacement : uint8_t {
  device,  // beside the parameters
  host,    // in host memory: gradients come to the host and new weights go back, sub-group by sub-group
  nvme,    // in a swap file (NVMe), a few sub-groups at a time in host memory; otherwise as host
};

// Optimizer offload: the placement and the host staging between the device and the host copies.
struct OptimizerOffload {
  StatePlacement placement = StatePlacement::device;
  bool pin_memory = false;  // pinned staging buffers (only where the parameters are on a GPU)
  int64_t buffer_count = 0; // offload_optimizer.buffer_count: staging slots each way (>= 2 used, <= the sub-groups);
                            // with nvme also the sub-group records in host memory (>= 3 used)
  std::string nvme_path;    // nvme: the directory of the swap files
  io::AioSettings aio;      // nvme: how the swap files are read and written
  UpdateTiming update = UpdateTiming::in_step;
  // Partial offload (offload_optimizer.ratio): the first ratio x (the rank's sub-groups, in update
  // order) at `placement`, the rest beside the parameters (host only; 1: all of them).
  double ratio = 1.0;
  // The host updates' threads (LibTorch's intra-op thread count: OMP_NUM_THREADS, which
  // tessera-launch sets to the rank's share of cores) and whether each is bound to a core of the
  // rank's share (when tessera-launch --bind-cores-to-rank bound the rank: TESSERA_CPU_LIST).
  int threads = 1;
  CoreBinding binding = CoreBinding::none;
  bool off_device() const { return placement != StatePlacement::device; }
};

struct EngineSpec {
  std::shared_ptr<const zero::ShardingPlan> plan;
  at::ScalarType dtype = at::kFloat;  // of the parameters and their gradients (fp32, bf16, fp16)
  c10::Device device = c10::Device(c10::kCPU);  // of the parameters: every buffer is allocated there
  bool fp16 = false;                  // check overflow and skip such steps
  bool fp32_master = false;           // fp32 master weights of the partition (bf16/fp16)
  bool fp32_grad_accumulation = false;  // bf16/fp16 gradients accumulate and are reduced in fp32
  bool overlap_comm = false;          // stages 0/1: reduce buckets as they fill during backward
  int rank = 0;                       // in the data-parallel group
  int world = 1;                      // data-parallel size
  // The rest is set by initialize() from EngineSettings (the config's values; no default here).
  std::chrono::milliseconds timeout{0};  // of every collective and every actor request
  // ZeRO-3: elements gathered ahead of demand at most (stage3_prefetch_bucket_size; 0: no
  // prefetch), and gathered at once at most (stage3_max_live_parameters; the unit a fetch asks
  // for is gathered whatever its size).
  int64_t prefetch_elements = 0;
  int64_t max_live_elements = 0;
  // ZeRO-3: a unit whose next use in the recorded order comes within this many elements of other
  // units' gathers stays gathered after a use (stage3_max_reuse_distance; 0: always released).
  int64_t max_reuse_elements = 0;
  // ZeRO-3 without an optimizer (ZeRO inference): no updates end a window; each Engine::forward
  // is one (the first is recorded, later ones prefetch along it).
  bool forward_windows = false;
  // ZeRO-3 with torch_autocast: forwards and backwards gather the lower-precision-safe groups in
  // bf16 (half the bytes; autocast rounds those weights to bf16 anyway, so results are the same).
  bool autocast_gathers = false;
  OptimizerOffload optimizer_offload;
  // Parameter offload (zero_optimization.offload_param, stage 3): where the weight buffers live.
  // Gathers copy the partitions' pieces into the units on the device ahead of use (the prefetch
  // order); updates write into the host copies. On NVMe (weight_home nvme) the partitions are in
  // parameter_swap's file, read piece by piece for the gathers and paged in whole for a step.
  zero::WeightHome weight_home = zero::WeightHome::with_units;
  zero::ParameterSwapOptions parameter_swap;  // weight_home nvme only

  int64_t owned_partition() const { return plan->owned_partition(rank); }
  zero::GradientMode gradient_mode() const { return plan->gradient_mode(); }
  // The dtype the optimizer steps in: fp32 masters, else the weights' own (their own master).
  at::ScalarType master_dtype() const { return fp32_master ? at::kFloat : dtype; }
  // The dtype gradients accumulate in across micro-steps.
  at::ScalarType accumulation_dtype() const { return fp32_grad_accumulation ? at::kFloat : dtype; }
  // The dtype flat group g's gradients are reduced in: bf16 for torch_autocast's lower-precision
  // modules (unless accumulating in fp32), else the accumulation dtype.
  at::ScalarType comm_dtype(int64_t g) const {
    if (fp32_grad_accumulation) return at::kFloat;
    return plan->groups().at(size_t(g)).lower_precision ? at::kBFloat16 : dtype;
  }
  // The dtype a forward's or backward's gather of flat group g travels in at ZeRO-3.
  at::ScalarType gather_dtype(int64_t g) const {
    return autocast_gathers && dtype == at::kFloat && plan->groups().at(size_t(g)).lower_precision ? at::kBFloat16 : dtype;
  }
};

}  // namespace tessera::actors
