#include "core/checkpoint/tensor_file_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/error.h"

namespace tessera::checkpoint {
namespace {

constexpr size_t kMaxCallBytes = size_t(1) << 30;  // Linux moves at most ~2 GiB per call anyway

const char* safetensors_dtype(affine::DType dtype) {
  switch (dtype) {
    case affine::DType::f32: return "F32";
    case affine::DType::f16: return "F16";
    case affine::DType::bf16: return "BF16";
    case affine::DType::f64: return "F64";
    case affine::DType::i8: return "I8";
    case affine::DType::u8: return "U8";
    case affine::DType::i16: return "I16";
    case affine::DType::i32: return "I32";
    case affine::DType::i64: return "I64";
    case affine::DType::bool8: return "BOOL";
  }
  return "?";
}

class SafetensorsWriter final : public TensorFileWriter {
 public:
  SafetensorsWriter(const std::string& path, const std::vector<OutputTensor>& tensors,
                    const std::map<std::string, std::string>& metadata)
      : order_(path, tensors), file_(path) {
    const std::string prefix = safetensors_prefix(tensors, metadata);
    file_.write(prefix.data(), prefix.size());
  }
  void write(const std::string& name, const void* data, int64_t bytes) override {
    order_.next(name, bytes);
    file_.write(data, size_t(bytes));
  }
  void finish() override {
    if (!order_.done()) throw CheckpointError(file_.path() + ": finished before its last tensor was written");
    file_.sync_and_close();
  }

 private:
  TensorOrder order_;
  OutputFile file_;
};

}  // namespace

std::string safetensors_prefix(const std::vector<OutputTensor>& tensors, const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  int64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                      {"shape", t.shape.to_vector()},
                      {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // as the reference writer pads
  const uint64_t n = text.size();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[size_t(i)] = static_cast<char>(n >> (8 * i));  // little-endian
  return prefix + text;
}

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  do {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) throw CheckpointError(path_ + ": cannot be created: " + std::strerror(errno));
}

OutputFile::~OutputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void OutputFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw CheckpointError(path_ + ": written after it was closed");
  const char* in = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t put = ::write(fd_, in + done, std::min(bytes - done, kMaxCallBytes));
    if (put < 0) {
      if (errno == EINTR) continue;
      throw CheckpointError(path_ + ": write failed: " + std::strerror(errno));
    }
    done += size_t(put);
  }
  written_ += int64_t(bytes);
}

void OutputFile::sync_and_close() {
  if (::fsync(fd_) != 0) throw CheckpointError(path_ + ": fsync failed: " + std::strerror(errno));
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) throw CheckpointError(path_ + ": close failed: " + std::strerror(errno));
}

TensorOrder::TensorOrder(std::string path, std::vector<OutputTensor> tensors)
    : path_(std::move(path)), tensors_(std::move(tensors)) {
  std::set<std::string> names;
  for (const auto& t : tensors_)
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second)
      throw CheckpointError(path_ + ": tensor name '" + t.name + "' is empty, reserved or given twice");
}

const OutputTensor& TensorOrder::next(const std::string& name, int64_t bytes) {
  if (done() || tensors_[next_].name != name)
    throw CheckpointError(path_ + ": tensor '" + name + "' written out of order (expected " +
                          (done() ? std::string("none") : "'" + tensors_[next_].name + "'") + ")");
  if (tensors_[next_].bytes() != bytes)
    throw CheckpointError(path_ + ": tensor '" + name + "' is " + std::to_string(tensors_[next_].bytes()) +
                          " bytes, " + std::to_string(bytes) + " given");
  return tensors_[next_++];
}

std::unique_ptr<TensorFileWriter> safetensors_writer(const std::string& path, const std::vector<OutputTensor>& tensors,
                                                     const std::map<std::string, std::string>& metadata) {
  return std::make_unique<SafetensorsWriter>(path, tensors, metadata);
}

}  // namespace tessera::checkpoint
