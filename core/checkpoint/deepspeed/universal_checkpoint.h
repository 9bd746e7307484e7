// DeepSpeed's universal checkpoint format (what its ds_to_universal writes; loaded by DeepSpeed with
// "checkpoint": {"load_universal": true}) read into a DsCheckpoint (ds_checkpoint.h), so that the
// import writes the same tessera checkpoint as for the sharded files. A universal tag directory:
//   mp_rank_00_model_states.pt (or ZeRO-3's zero_pp_rank_0_...): names, shapes, counters, as sharded;
//   zero/optimizer_state.pt: loss_scaler, zero_stage, param_groups (the lrs), no tensors;
//   zero/<parameter>/fp32.pt, <state>.pt (exp_avg, exp_avg_sq, ...): {'param': the full tensor,
//     'cat_dim': ...} (or the bare tensor); zero/<parameter>/step.pt: the optimizer's step.
// The full tensors are cut into the flat layout the saved stage implies (ds_checkpoint.h), for
// dp_world_size ranks: ZeRO-1/2 groups padded as DeepSpeed pads them (to a multiple of 2 x ranks),
// ZeRO-3 tensors in ceil(numel / ranks) shares. A ZeRO-2 universal checkpoint thus imports into the
// same rank files as the sharded checkpoint it came from.
//
// Example: the fixture z2_fp32_universal (2 ranks, one group of 21,648 elements): rank 0's master/0
// is elements [0, 10824) of 0.weight's fp32.pt; rank 1's the rest of it and the other five.
#pragma once

#include <string>

#include "core/checkpoint/deepspeed/ds_checkpoint.h"

namespace tessera::checkpoint::deepspeed {

// True when the tag directory holds zero/optimizer_state.pt.
bool is_universal_tag(const std::string& tag_dir);

// Fills ds (its model-states fields already read): stage, layout, groups' buffers, state names,
// the optimizer's step, group lrs, the fp16 loss scaler. CheckpointError naming the file and the
// parameter at fault (a missing folder or file, a shape not param_shapes', a state one parameter lacks).
void read_universal(DsCheckpoint& ds);

}  // namespace tessera::checkpoint::deepspeed
