// A SavedTensorReader assembles one stored tensor of a checkpoint (a SavedMap over the rank files)
// into a contiguous row-major buffer, reading only the chunks of the files its segments touch and
// verifying every chunk it uses against the manifest's XXH3 before any of its bytes are used.
//
// Memory: one read buffer of the largest chunk (4 MiB as saved) besides the caller's target; a
// chunk wholly inside one run is read straight into the target. Segments are visited in source
// order, so a chunk shared by consecutive pieces is read once.
// Errors: CheckpointError naming the file and the tensor (a missing or resized file at
// construction; a map that does not cover the tensor or reaches outside its buffer at plan(); a
// chunk whose hash differs at read(), before the target is handed back).
//
// Example: a [2896, 2896] fp32 master partitioned over 2 rank files (stage 3) is 2 segments of
// 4,193,408 elements each; read() fills 33.5 MB of target from 9 chunks of each file.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/affine/plan.h"
#include "core/checkpoint/manifest.h"

namespace tessera::io::detail {
class ReadOnlyFile;
}

namespace tessera::checkpoint {

class SavedTensorReader {
 public:
  // Opens every rank file of `manifest` (which must outlive the reader) inside `tag_dir`.
  SavedTensorReader(const Manifest& manifest, std::string tag_dir);
  ~SavedTensorReader();
  SavedTensorReader(const SavedTensorReader&) = delete;
  SavedTensorReader& operator=(const SavedTensorReader&) = delete;

  // The copies that move `saved` into one contiguous row-major target (file ranks as sources).
  affine::Plan plan(const SavedMap& saved) const;
  // Fills `target` (saved.map.numel() elements of saved.map.dtype) as `plan` says.
  void read(const SavedMap& saved, const affine::Plan& plan, void* target);

  int64_t bytes_read() const { return bytes_read_; }       // from the files, every chunk counted
  int64_t read_buffer_bytes() const { return int64_t(chunk_.size()); }

 private:
  struct Source {
    const RankFile* file = nullptr;
    const SavedBuffer* buffer = nullptr;
    const io::detail::ReadOnlyFile* handle = nullptr;
  };
  Source source(const SavedMap& saved, int file_rank) const;
  void copy_run(const SavedMap& saved, const Source& src, int64_t source_element, char* target, int64_t elements);
  void read_chunk(const SavedMap& saved, const Source& src, int64_t chunk, char* into);

  const Manifest& manifest_;
  std::string tag_dir_;
  std::map<int, std::unique_ptr<io::detail::ReadOnlyFile>> files_;  // by file rank
  std::vector<char> chunk_;                                         // the one read buffer
  const SavedBuffer* cached_buffer_ = nullptr;                      // what chunk_ holds
  int64_t cached_chunk_ = -1;
  int64_t bytes_read_ = 0;
};

}  // namespace tessera::checkpoint
