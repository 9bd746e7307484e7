// Offline checks of a checkpoint (no engine, no ranks): `tessera checkpoint verify` and
// `inspect`. verify reads every byte of every file once: each file against its XXH3, each
// buffer chunk against its own, and every map against its tensor's shape (valid, covering the
// tensor) and its file's buffer (which must exist and hold every piece).
#pragma once

#include <string>
#include <vector>

#include "core/checkpoint/manifest.h"

namespace tessera::checkpoint {

// DIR is a tag directory (it holds manifest.json) or a root (DIR/latest names the tag).
std::string tag_directory(const std::string& dir);
// The manifest of a tag directory (CheckpointError naming it).
Manifest read_manifest(const std::string& tag_dir);

struct VerifyReport {
  std::string tag_dir;
  int64_t bytes_checked = 0;
  int64_t maps_checked = 0;
  std::vector<std::string> problems;  // each names the file, buffer or tensor
  bool ok() const { return problems.empty(); }
};
VerifyReport verify_tag(const std::string& tag_dir);

// A human-readable summary: layout, counters, kinds, tensors and sizes, what each file holds.
std::string describe(const Manifest& manifest);

}  // namespace tessera::checkpoint
