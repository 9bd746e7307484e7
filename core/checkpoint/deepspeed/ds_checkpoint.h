// A DeepSpeed ZeRO checkpoint as tessera reads it (no Python): one tag directory of
//   mp_rank_00_model_states.pt (ZeRO-1/2) or zero_pp_rank_<r>_mp_rank_00_model_states.pt (ZeRO-3):
//     parameter names and shapes per group (param_shapes), the module's weights, counters, ds_config;
//   [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt, one per data-parallel rank r: that rank's
//     flat fp32 master partition and optimizer states, the step, group lrs, the loss scaler.
// DeepSpeed's flat layouts (core/affine/zero_storage.h describes the same):
//   ZeRO-1/2: per param group, the group's tensors concatenated in param_shapes order, padded at the
//     end, cut into W partitions of P elements; rank r holds [r*P, (r+1)*P) (the last rank's tail
//     may be padding). param_slice_mappings, where present, must agree (a reordering is refused).
//   ZeRO-3: each tensor is cut into W partitions of ceil(numel / W) (padding on the last ranks);
//     a rank's flat groups (sub-groups) concatenate its partition of every tensor, in the order of
//     all param_shapes groups; read here as one flat group.
// DeepSpeed's universal format (ds_to_universal's output, DIR/latest_universal): the same tag
// directory holds the model-states file and zero/: optimizer_state.pt (loss scaler, zero_stage,
// param_groups) and per parameter zero/<name>/fp32.pt, <state>.pt, step.pt, each a full tensor;
// read by universal_checkpoint.h into the flat layout its stage implies (universal_checkpoint.h).
// Frozen parameters (requires_grad false: frozen_param_shapes, frozen_param_fragments) are read
// whole: ZeRO-1/2 keep each whole in the model-states file; ZeRO-3 keeps each rank's partition of
// ceil(numel / W) elements in that rank's model-states file (concatenated in rank order, cut to
// numel, as DeepSpeed's zero_to_fp32 merges them).
//
// Example (the fixture z1_fp32: 2 ranks, 21,648 fp32 elements in one group): P = 10,824; rank 1's
// partition starts inside 0.weight (element 10,824 of 16,384), then holds everything after it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/dtype.h"

namespace tessera::checkpoint::deepspeed {

struct DsParameter {
  std::string name;
  std::vector<int64_t> shape;
  int64_t elements() const;
};

// One flat fp32 buffer per rank and its optimizer states alike.
struct DsFlatGroup {
  std::vector<DsParameter> parameters;            // in flat order
  std::vector<std::vector<char>> master;          // per rank: f32 bytes (padding included)
  std::map<std::string, std::vector<std::vector<char>>> states;  // state name -> per rank, f32 bytes
  int64_t rank_elements(int rank) const { return int64_t(master.at(size_t(rank)).size() / 4); }
};

// A frozen parameter, whole, in its saved dtype.
struct DsFrozen {
  std::string name;
  affine::DType dtype = affine::DType::f32;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

enum class DsLayout { zero12, zero3 };

struct DsLossScaler {
  bool dynamic = false;
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int64_t hysteresis_left = 0;
};

struct DsCheckpoint {
  std::string tag_dir;
  bool universal = false;                          // read from DeepSpeed's universal format
  std::string tag;
  int stage = 0;
  int world = 1;                                   // data-parallel ranks that saved it
  DsLayout layout = DsLayout::zero12;
  affine::DType dtype = affine::DType::f32;        // the module's weights (bf16, f16: fp32 masters beside them)
  std::vector<std::string> parameter_order;        // trainable parameters in model order
  std::vector<DsFrozen> frozen;                    // frozen parameters, in frozen_param_shapes order
  std::vector<DsFlatGroup> groups;                 // ZeRO-1/2: one per param group; ZeRO-3: one
  std::vector<std::string> state_names;            // e.g. exp_avg, exp_avg_sq
  int64_t global_steps = 0, skipped_steps = 0, global_samples = 0;
  int64_t gradient_accumulation_steps = 1;         // from ds_config (1 when it is not there)
  int64_t optimizer_step = 0;                      // the optimizer's own step count (Adam's bias correction)
  std::vector<double> group_lrs;                   // per param group
  bool has_loss_scaler = false;                    // fp16 only (bf16 and fp32 train unscaled)
  DsLossScaler loss_scaler;
  std::string config_json = "{}";                  // ds_config as saved
};

// True when DIR (or DIR/<tag>) holds DeepSpeed files and no tessera manifest: DIR/latest (else
// DIR/latest_universal, or `tag`) names a directory with a model-states file.
bool is_deepspeed_checkpoint(const std::string& dir, const std::string& tag = "");

// Reads and checks every file; CheckpointError naming the file (and tensor) at fault. `tag` empty:
// the one DIR/latest (else DIR/latest_universal) names. Holds every rank's partitions in memory.
DsCheckpoint read_deepspeed_checkpoint(const std::string& dir, const std::string& tag = "");

struct PickleValue;
namespace detail {  // shared by the sharded reader and the universal one
// The ZeRO stage an optimizer state dict says (zero_stage), else ds_config's, else by layout.
int stage_of(const PickleValue& optimizer_state, const DsCheckpoint& ds);
DsLossScaler loss_scaler_of(const PickleValue& scaler, const std::string& path);
}  // namespace detail

}  // namespace tessera::checkpoint::deepspeed
