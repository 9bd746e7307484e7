// A TensorFileWriter streams tensors into one output file in a declared order: the file's table of
// contents (a safetensors header, a PyTorch pickle) is written first from names and shapes alone,
// then each tensor's bytes as they come, so a writer holds no tensor of its own.
//
// Formats:
//   safetensors  [8-byte N][JSON header, space-padded to 8][data], `metadata` in "__metadata__"
//                (Hugging Face's loaders want {"format": "pt"}).
//   pytorch_bin  what Python's torch.save writes for an OrderedDict of name -> tensor: a zip
//                archive (LibTorch's PyTorchStreamWriter) of data.pkl (pickle protocol 2, storages as
//                persistent ids), one record data/<i> per tensor, byteorder and version; torch.load
//                reads it, weights_only=True included.
// Files are created new (O_EXCL) and synced by finish(); on an error the caller removes them.
// Errors: CheckpointError naming the file (and the tensor where one is at fault).
//
// Example: two f32 tensors "a" [2, 3] and "b" [4] as safetensors: header offsets [0, 24) and
// [24, 40), then write("a", 24 bytes), write("b", 16 bytes), finish().
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/affine/box.h"
#include "core/affine/dtype.h"

namespace tessera::checkpoint {

struct OutputTensor {
  std::string name;
  affine::DType dtype = affine::DType::f32;
  affine::Dims shape;
  int64_t bytes() const { return shape.product() * affine::element_size(dtype); }
};

class TensorFileWriter {
 public:
  virtual ~TensorFileWriter() = default;
  // The next tensor of the declared order, `bytes` of it (CheckpointError if out of order or sized wrong).
  virtual void write(const std::string& name, const void* data, int64_t bytes) = 0;
  // After the last tensor: the file's tail, flushed and fsynced.
  virtual void finish() = 0;
};

std::unique_ptr<TensorFileWriter> safetensors_writer(const std::string& path, const std::vector<OutputTensor>& tensors,
                                                     const std::map<std::string, std::string>& metadata);
// The first bytes of a safetensors file of `tensors` in this order: the 8-byte length and the
// space-padded JSON header; the data section follows, tensors packed in order.
std::string safetensors_prefix(const std::vector<OutputTensor>& tensors, const std::map<std::string, std::string>& metadata);
// f32, f16, bf16, f64 and the integer types of affine::DType.
std::unique_ptr<TensorFileWriter> pytorch_bin_writer(const std::string& path, const std::vector<OutputTensor>& tensors);

// An output file created new, written whole (EINTR, short writes), synced; closed on destruction.
class OutputFile {
 public:
  explicit OutputFile(std::string path);  // O_CREAT | O_EXCL
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void write(const void* data, size_t bytes);
  void sync_and_close();
  const std::string& path() const { return path_; }
  int64_t written() const { return written_; }

 private:
  std::string path_;
  int fd_ = -1;
  int64_t written_ = 0;
};

// The declared order, checked as tensors come (shared by the writers).
class TensorOrder {
 public:
  TensorOrder(std::string path, std::vector<OutputTensor> tensors);
  const OutputTensor& next(const std::string& name, int64_t bytes);  // CheckpointError if not the next one
  bool done() const { return next_ == tensors_.size(); }
  const std::vector<OutputTensor>& tensors() const { return tensors_; }

 private:
  std::string path_;
  std::vector<OutputTensor> tensors_;
  size_t next_ = 0;
};

}  // namespace tessera::checkpoint
