// A SafetensorsFile is an open, validated Hugging Face safetensors file whose tensors are read by
// name, straight from the file into tensor memory (pread, no mmap, no staging copy).
//
// Opening reads only the 8-byte length N and the N-byte JSON header (N <= 100 MiB, N <= size - 8)
// and validates it (core/io/safetensors_header.h): afterwards every tensor's bytes are known to lie
// inside the file, so read() of a 1 GiB tensor costs one allocation and one pass over the page cache.
// Example: a 256 MiB file with 100 tensors opens with two preads of 8 and ~10 KiB.
//
// Ownership: the object owns a read-only descriptor, shared by its copies; it is immutable, so
// several threads may read from one object at once. If the file is replaced after opening, reads
// see the old file (the descriptor is kept); if it shrinks, a read throws "truncated".
//
// write_safetensors writes the same format (header space-padded to a multiple of 8 bytes, as the
// reference does) atomically: <path>.tmp, fsync, rename. All errors are tessera::CheckpointError
// naming the file and the tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/io/safetensors_header.h"

namespace tessera::io {

namespace detail {
class ReadOnlyFile;
}

class SafetensorsFile {
 public:
  explicit SafetensorsFile(std::string path);

  const StHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const StTensorInfo& info(const std::string& name) const;  // CheckpointError "<file>: no tensor 'x'"

  // A new contiguous CPU tensor of the stored dtype and shape holding the stored bytes bitwise.
  at::Tensor read(const std::string& name) const;
  // Reads into `destination`, which must be a contiguous strided CPU tensor of the stored dtype and
  // shape (else CheckpointError naming the tensor and both dtypes/shapes, destination untouched).
  void read_into(const std::string& name, at::Tensor destination) const;

 private:
  std::string path_;
  StHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in header_.tensors
  std::shared_ptr<const detail::ReadOnlyFile> file_;
};

// Writes `tensors` (in this order; moved to CPU and made contiguous; unique names; dtypes of
// StDtype) and `metadata` to `path` atomically. Validates everything before creating any file.
// Returns the bytes written before the tensors' (the 8-byte length and the header), so that a
// caller can hash the file from memory instead of reading it back.
std::string write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

at::ScalarType to_scalar_type(StDtype dtype);
StDtype from_scalar_type(at::ScalarType type);  // CheckpointError for types safetensors/tessera lacks

}  // namespace tessera::io
