// describe() prints a Config as one line per value, each marked with its provenance: given in
// the file, DeepSpeed's default, derived (with the arithmetic), or still auto (with the fact it
// waits for). Keys tessera passes through are marked ignored or not yet supported. This is what
// `tessera config check` prints.
//
// Example (Accelerate's zero_stage2_config.json, no facts given):
//   train_batch_size = "auto"                        # auto: waits for the world size (--world-size) ...
//   gradient_accumulation_steps = 1                  # given
//   zero_optimization.allgather_bucket_size = 200000000  # given
//   zero_optimization.sub_group_size = 1000000000    # default
//   optimizer.params.lr = "auto"                     # auto: waits for the learning rate (--lr)
#pragma once

#include <string>

#include "core/config/config.h"

namespace tessera::config {

std::string describe(const Config& config);

}  // namespace tessera::config
