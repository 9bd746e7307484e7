// A checkpoint's manifest: what a tag directory holds and how to read it back at any layout
// (docs/DESIGN.md §8.4). A checkpoint is one more storage whose "ranks" are the rank files: every
// saved map says, per file, which boxes of a tensor lie at which offsets of which flat buffer of
// that file, so loading at another layout is a plan from these maps into the new engine's maps.
//
// On disk (DIR/TAG/): rank<r>.safetensors per saving rank (flat 1-D buffers named by
// "<kind>/<group>" keys), and manifest.json, written last: a tag directory without it is not a
// checkpoint. Hashes are XXH3-64: one per file and one per chunk of each buffer (chunk_bytes), so
// a load that reads some byte ranges still verifies every byte it uses. JSON, never pickles.
//
// Example (stage 2, 2 ranks, fp32): rank0.safetensors holds "param/0" (the replicated weights,
// written once), "exp_avg/0", "exp_avg_sq/0" (partition 0); the "master" maps point into
// "param/0" of file 0 (fp32 masters are the weights: one storage for both).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/optim/loss_scaler.h"  // LossScalerSnapshot: a struct, no LibTorch

namespace tessera::checkpoint {

inline constexpr const char* kManifestName = "manifest.json";
inline constexpr const char* kFormat = "tessera.checkpoint";
inline constexpr int kFormatVersion = 1;

// One flat buffer of a rank file.
struct SavedBuffer {
  std::string key;            // "<kind>/<group>", e.g. "exp_avg/0"
  affine::DType dtype = affine::DType::f32;
  int64_t elements = 0;
  int64_t data_offset = 0;    // byte offset of its first element in the file
  int64_t chunk_bytes = 0;    // hashed in chunks of this many bytes (the last may be shorter)
  std::vector<uint64_t> chunk_hashes;
};

struct RankFile {
  int rank = 0;               // the saving rank (the "rank" of the checkpoint storage)
  std::string file;           // name inside the tag directory
  int64_t bytes = 0;
  uint64_t hash = 0;          // of the whole file
  std::vector<SavedBuffer> buffers;
  const SavedBuffer* find(const std::string& key) const;
};

// A stored tensor as the files hold it: map.ranks are file ranks; `buffers` names, per file rank,
// the buffer its pieces address.
struct SavedMap {
  std::string kind;           // "param", "master", "exp_avg", ...
  affine::TensorMap map;      // map.name is the parameter's dotted name
  std::map<int, std::string> buffers;
};

struct ParameterInfo {
  std::string name;
  affine::DType dtype = affine::DType::f32;
  affine::Dims shape;
};

// A frozen parameter (requires_grad false: not trained, not sharded, whole on every rank), saved
// whole in one rank file as DeepSpeed keeps it in its module states, so that a load restores it.
struct FrozenTensor {
  std::string name;
  affine::DType dtype = affine::DType::f32;
  affine::Dims shape;
  int file = 0;        // the file rank holding it
  std::string buffer;  // its buffer there ("frozen/<i>")
};

// The engine's counters, enough to continue bit for bit.
struct EngineCounters {
  int64_t global_steps = 0;
  int64_t micro_steps = 0;
  int64_t skipped_steps = 0;
  int64_t optimizer_updates = 0;       // the optimizer's step count (bias corrections)
  std::vector<double> group_lrs;       // each parameter group's lr setting (set_lr)
  std::vector<double> last_lrs;        // the lrs of the last update (get_last_lr)
  bool has_loss_scaler = false;
  optim::LossScalerSnapshot loss_scaler;
};

struct Manifest {
  std::string tag;
  int world_size = 1;          // data-parallel ranks that saved it
  int stage = 0;
  int tp_size = 1;             // tensor-parallel size (1 until tensor parallelism lands)
  std::string dtype;           // the weights' dtype ("f32", "bf16", "f16")
  std::vector<ParameterInfo> parameters;  // trainable parameters, model order
  std::vector<FrozenTensor> frozen;       // frozen parameters, model order
  bool frozen_recorded = true;            // false: a manifest from before frozen parameters were saved
  std::vector<std::string> kinds;         // every stored kind: "param", "master", states...
  std::vector<RankFile> files;
  std::vector<SavedMap> maps;
  EngineCounters engine;
  std::string client_state = "{}";  // a JSON object, returned by load
  std::string config;               // the resolved config (JSON), for inspection

  const RankFile& file_of_rank(int rank) const;  // CheckpointError when absent
};

std::string to_json(const Manifest& manifest);
std::string to_json(const RankFile& file);
RankFile rank_file_from_json(const std::string& text, const std::string& where);
// CheckpointError naming `where` (the manifest's path) and the JSON path of what is wrong.
Manifest manifest_from_json(const std::string& text, const std::string& where);

}  // namespace tessera::checkpoint
