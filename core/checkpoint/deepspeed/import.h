// import_deepspeed(): a DeepSpeed ZeRO-1/2/3 checkpoint, sharded or in DeepSpeed's universal format
// (ds_checkpoint.h, universal_checkpoint.h), written as a tessera checkpoint (manifest.h) that
// `tessera checkpoint verify` accepts and Engine::load_checkpoint resumes at any data-parallel size
// and stage. `tessera checkpoint import DS_DIR OUT`.
//
// The import is one more storage: DeepSpeed's rank r becomes the checkpoint's file rank r
// (OUT/<tag>/rank<r>.safetensors), holding its partitions as flat buffers "master/<g>" (fp32) and
// one per optimizer state ("exp_avg/<g>", ...), padding included; each tensor's map says which runs
// of it lie where (stored_runs, core/affine/zero_storage.h), padding never mapped. The weights
// ("param"): with fp32 training, the masters' maps again (one storage for both, as tessera saves
// them); with bf16/fp16, "param/<g>" buffers of the masters rounded to that dtype (what DeepSpeed
// itself copies into the module after loading fp32 masters). Counters: global and skipped steps,
// micro steps (global steps x gradient_accumulation_steps), the optimizer's step, group lrs,
// the fp16 loss scaler.
//
// Atomic: everything is read and checked first; OUT/<tag>/ and OUT/latest are written into a
// hidden sibling of OUT and renamed into place at the end (OUT must not exist, or be empty);
// on any error it is removed and OUT never appears.
//
// Example: the fixture z1_fp32 (2 ranks, 21,648 fp32 parameters) gives OUT/global_step5/rank0.safetensors
// and rank1.safetensors with "master/0", "exp_avg/0", "exp_avg_sq/0" of 10,824 elements each.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::checkpoint::deepspeed {

struct ImportOptions {
  std::string tag;  // DeepSpeed's tag under DS_DIR (empty: the one DS_DIR/latest names); kept as OUT's tag
};

struct ImportReport {
  std::string source_dir;  // the DeepSpeed tag directory read
  std::string out_dir;     // OUT (a tessera checkpoint root)
  std::string tag;
  int stage = 0;
  int world = 0;
  std::string dtype;       // of the weights
  int64_t parameters = 0;
  int64_t elements = 0;    // of all parameters
  int64_t bytes_written = 0;
};

ImportReport import_deepspeed(const std::string& ds_dir, const std::string& out, const ImportOptions& options = {});

}  // namespace tessera::checkpoint::deepspeed
