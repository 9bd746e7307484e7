#include "core/io/safetensors.h"

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstring>
#include <set>

#include "core/error.h"
#include "core/text.h"
#include "core/io/detail/posix_file.h"

// Tensor bytes go to and from the file as they lie in memory; safetensors is little-endian.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tessera_io assumes a little-endian host");

namespace tessera::io {
namespace {

constexpr uint64_t kMaxHeaderBytes = uint64_t(100) << 20;  // the reference implementation's limit

// BOOL bytes other than 0 and 1 are not valid at::kBool values.
void check_bool_bytes(const uint8_t* bytes, uint64_t count, const std::string& file, const std::string& name) {
  for (uint64_t i = 0; i < count; ++i)
    if (bytes[i] > 1)
      throw CheckpointError(file + ": tensor '" + name + "': BOOL element " + std::to_string(i) + " is byte " +
                            std::to_string(bytes[i]) + ", not 0 or 1");
}

}  // namespace

at::ScalarType to_scalar_type(StDtype dtype) {
  switch (dtype) {
    case StDtype::f32: return at::kFloat;
    case StDtype::f16: return at::kHalf;
    case StDtype::bf16: return at::kBFloat16;
    case StDtype::f64: return at::kDouble;
    case StDtype::i64: return at::kLong;
    case StDtype::i32: return at::kInt;
    case StDtype::i16: return at::kShort;
    case StDtype::i8: return at::kChar;
    case StDtype::u8: return at::kByte;
    case StDtype::boolean: return at::kBool;
  }
  throw CheckpointError("safetensors: invalid StDtype value " + std::to_string(int(dtype)));
}

StDtype from_scalar_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat: return StDtype::f32;
    case at::kHalf: return StDtype::f16;
    case at::kBFloat16: return StDtype::bf16;
    case at::kDouble: return StDtype::f64;
    case at::kLong: return StDtype::i64;
    case at::kInt: return StDtype::i32;
    case at::kShort: return StDtype::i16;
    case at::kChar: return StDtype::i8;
    case at::kByte: return StDtype::u8;
    case at::kBool: return StDtype::boolean;
    default: break;
  }
  throw CheckpointError(std::string("safetensors: dtype ") + c10::toString(type) +
                        " is not supported (F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL)");
}

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  auto file = std::make_shared<detail::ReadOnlyFile>(path_);
  const uint64_t size = file->size_bytes();
  if (size < 8)
    throw CheckpointError(path_ + ": truncated: " + std::to_string(size) +
                          " bytes, shorter than the 8-byte header length of a safetensors file");
  uint8_t prefix[8];
  file->pread_exact(prefix, 8, 0, "the header length");
  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes == 0) throw CheckpointError(path_ + ": safetensors header length is 0");
  if (header_bytes > kMaxHeaderBytes)
    throw CheckpointError(path_ + ": safetensors header length " + std::to_string(header_bytes) +
                          " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (header_bytes > size - 8)
    throw CheckpointError(path_ + ": truncated: the header length says " + std::to_string(header_bytes) +
                          " bytes but only " + std::to_string(size - 8) + " follow it");
  std::string json(size_t(header_bytes), '\0');
  file->pread_exact(json.data(), header_bytes, 8, "the header");
  header_ = parse_safetensors_header(json, size - 8 - header_bytes, path_);
  for (size_t i = 0; i < header_.tensors.size(); ++i) index_.emplace(header_.tensors[i].name, i);
  file_ = std::move(file);
}

const StTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const auto found = index_.find(name);
  if (found == index_.end()) throw CheckpointError(path_ + ": no tensor '" + name + "'");
  return header_.tensors[found->second];
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const StTensorInfo& tensor = info(name);
  at::Tensor out = at::empty(tensor.shape, at::TensorOptions().dtype(to_scalar_type(tensor.dtype)));
  if (tensor.bytes() == 0) return out;
  const uint64_t offset = 8 + header_.header_bytes + tensor.begin;
  file_->pread_exact(out.data_ptr(), tensor.bytes(), offset, "tensor '" + name + "'");
  if (tensor.dtype == StDtype::boolean)
    check_bool_bytes(static_cast<const uint8_t*>(out.data_ptr()), tensor.bytes(), path_, name);
  return out;
}

void SafetensorsFile::read_into(const std::string& name, at::Tensor destination) const {
  const StTensorInfo& tensor = info(name);
  const at::ScalarType stored = to_scalar_type(tensor.dtype);
  const std::string stored_text = std::string(dtype_name(tensor.dtype)) + " " + shape_text(tensor.shape);
  auto refuse = [&](const std::string& why) {
    throw CheckpointError(path_ + ": tensor '" + name + "' (" + stored_text + ") cannot be read into " + why);
  };
  if (!destination.defined()) refuse("an undefined tensor");
  const std::string destination_text = std::string(c10::toString(destination.scalar_type())) + " " +
                                       shape_text(destination.sizes().vec()) + " on " + destination.device().str();
  if (destination.device().type() != at::kCPU || destination.layout() != at::kStrided)
    refuse("a non-CPU or non-strided tensor: " + destination_text);
  if (destination.scalar_type() != stored) refuse("a tensor of another dtype: " + destination_text);
  if (destination.sizes() != at::IntArrayRef(tensor.shape)) refuse("a tensor of another shape: " + destination_text);
  if (!destination.is_contiguous()) refuse("a non-contiguous tensor: " + destination_text);
  if (tensor.bytes() == 0) return;
  const uint64_t offset = 8 + header_.header_bytes + tensor.begin;
  if (tensor.dtype == StDtype::boolean) {  // validate before touching the destination
    std::vector<uint8_t> staging(size_t(tensor.bytes()));
    file_->pread_exact(staging.data(), tensor.bytes(), offset, "tensor '" + name + "'");
    check_bool_bytes(staging.data(), staging.size(), path_, name);
    std::memcpy(destination.data_ptr(), staging.data(), staging.size());
    return;
  }
  file_->pread_exact(destination.data_ptr(), tensor.bytes(), offset, "tensor '" + name + "'");
}

std::string write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) header["__metadata__"][key] = value;
  }
  std::set<std::string> names;
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    const std::string where = path + ": tensor '" + name + "': ";
    if (name == "__metadata__") throw CheckpointError(where + "the name is reserved for metadata");
    if (!names.insert(name).second) throw CheckpointError(where + "the name appears twice");
    if (!tensor.defined()) throw CheckpointError(where + "undefined tensor");
    StDtype dtype;
    try {
      dtype = from_scalar_type(tensor.scalar_type());
    } catch (const CheckpointError& e) {
      throw CheckpointError(where + e.what());
    }
    if (tensor.layout() != at::kStrided) throw CheckpointError(where + "not a strided (dense) tensor");
    contiguous.push_back(tensor.to(at::kCPU).contiguous());
    const uint64_t bytes = uint64_t(tensor.numel()) * element_size(dtype);
    header[name] = {{"dtype", dtype_name(dtype)},
                    {"shape", tensor.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {
    throw CheckpointError(path + ": cannot write the safetensors header (names and metadata must be UTF-8): " +
                          e.what());
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes)
    throw CheckpointError(path + ": the safetensors header would be " + std::to_string(text.size()) +
                          " bytes, over the readers' limit of " + std::to_string(kMaxHeaderBytes));
  uint8_t prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = uint8_t(uint64_t(text.size()) >> (8 * i));

  std::vector<detail::ByteSpan> pieces = {{prefix, 8}, {text.data(), text.size()}};
  for (const at::Tensor& tensor : contiguous)
    if (tensor.numel() > 0) pieces.push_back({tensor.data_ptr(), size_t(tensor.nbytes())});
  detail::write_file_atomically(path, pieces);
  return std::string(reinterpret_cast<const char*>(prefix), 8) + text;
}

}  // namespace tessera::io
