#include "core/io/safetensors_header.h"

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "core/error.h"
#include "core/io/detail/strict_json.h"

namespace tessera::io {
namespace {

using nlohmann::json;

struct DtypeSpelling {
  StDtype dtype;
  const char* name;
  size_t bytes;
};

constexpr DtypeSpelling kDtypes[] = {
    {StDtype::f32, "F32", 4}, {StDtype::f16, "F16", 2}, {StDtype::bf16, "BF16", 2}, {StDtype::f64, "F64", 8},
    {StDtype::i64, "I64", 8}, {StDtype::i32, "I32", 4}, {StDtype::i16, "I16", 2},   {StDtype::i8, "I8", 1},
    {StDtype::u8, "U8", 1},   {StDtype::boolean, "BOOL", 1}};

const DtypeSpelling& spelling(StDtype dtype) {
  for (const auto& s : kDtypes)
    if (s.dtype == dtype) return s;
  throw CheckpointError("safetensors: invalid StDtype value " + std::to_string(int(dtype)));
}

// A JSON value, shortened for a message (the header may be up to 100 MiB).
std::string show(const json& value) {
  std::string text = value.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > 64) text = text.substr(0, 61) + "...";
  return text;
}

// "<file>: safetensors header: tensor 'x': " + why.
[[noreturn]] void refuse(const std::string& file, const std::string& tensor, const std::string& why) {
  std::string message = file + ": safetensors header: ";
  if (!tensor.empty()) message += "tensor '" + tensor + "': ";
  throw CheckpointError(message + why);
}

std::string range(uint64_t begin, uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + ")";
}

StTensorInfo parse_tensor(const std::string& name, const json& entry, uint64_t data_bytes, const std::string& file) {
  if (!entry.is_object()) refuse(file, name, "entry is not an object but " + show(entry));
  for (const auto& [key, value] : entry.items()) {
    (void)value;
    if (key != "dtype" && key != "shape" && key != "data_offsets")
      refuse(file, name, "unknown field \"" + key + "\" (expected dtype, shape, data_offsets)");
  }
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(field)) refuse(file, name, std::string("missing field \"") + field + "\"");

  StTensorInfo info;
  info.name = name;
  const json& dtype = entry.at("dtype");
  if (!dtype.is_string()) refuse(file, name, "dtype is not a string but " + show(dtype));
  const auto* found = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                                   [&](const DtypeSpelling& s) { return dtype.get_ref<const std::string&>() == s.name; });
  if (found == std::end(kDtypes))
    refuse(file, name, "unknown dtype " + show(dtype) + " (tessera reads F32 F16 BF16 F64 I64 I32 I16 I8 U8 BOOL)");
  info.dtype = found->dtype;

  const json& shape = entry.at("shape");
  if (!shape.is_array()) refuse(file, name, "shape is not an array but " + show(shape));
  uint64_t numel = 1;
  for (const json& dim : shape) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
      refuse(file, name, "shape " + show(shape) + " has " + show(dim) + ", not a non-negative integer");
    const uint64_t extent = dim.get<uint64_t>();
    if (extent != 0 && numel > std::numeric_limits<uint64_t>::max() / extent)
      refuse(file, name, "shape " + show(shape) + " has more elements than 2^64");
    numel *= extent;
    info.shape.push_back(int64_t(extent));
  }
  const uint64_t element = found->bytes;
  if (numel > uint64_t(std::numeric_limits<int64_t>::max()) / element)
    refuse(file, name, "shape " + show(shape) + " has more bytes than 2^63");
  const uint64_t expected_bytes = numel * element;

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    refuse(file, name, "data_offsets " + show(offsets) + " is not two unsigned integers [begin, end]");
  info.begin = offsets[0].get<uint64_t>();
  info.end = offsets[1].get<uint64_t>();
  if (info.begin > info.end) refuse(file, name, "data_offsets " + range(info.begin, info.end) + " has begin > end");
  if (info.end > data_bytes)
    refuse(file, name, "data_offsets " + range(info.begin, info.end) + " end beyond the data section of " +
                           std::to_string(data_bytes) + " bytes (file truncated?)");
  if (info.end - info.begin != expected_bytes)
    refuse(file, name, "data_offsets " + range(info.begin, info.end) + " hold " +
                           std::to_string(info.end - info.begin) + " bytes but " + found->name + " " + show(shape) +
                           " needs " + std::to_string(expected_bytes));
  return info;
}

}  // namespace

size_t element_size(StDtype dtype) { return spelling(dtype).bytes; }

const char* dtype_name(StDtype dtype) { return spelling(dtype).name; }

const StTensorInfo* StHeader::find(const std::string& name) const {
  for (const auto& tensor : tensors)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

StHeader parse_safetensors_header(std::string_view text, uint64_t data_bytes, const std::string& file) {
  // Depth 3: the top object, a tensor entry, its shape / data_offsets arrays.
  const json root = detail::parse_strict_json(text, 3, file + ": safetensors header");
  if (!root.is_object()) refuse(file, "", "top level is not a JSON object but " + show(root));

  StHeader header;
  header.header_bytes = text.size();
  header.data_bytes = data_bytes;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) refuse(file, "", "__metadata__ is not an object but " + show(entry));
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) refuse(file, "", "__metadata__ \"" + key + "\" is not a string but " + show(value));
        header.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    header.tensors.push_back(parse_tensor(name, entry, data_bytes, file));
  }

  // Tiling: sorted by begin, each tensor starts where the previous ended and the last ends at
  // data_bytes. Zero-byte tensors may share an offset; (begin, end, name) makes the order total.
  std::sort(header.tensors.begin(), header.tensors.end(), [](const StTensorInfo& a, const StTensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;  // [0, covered) is tiled so far
  const StTensorInfo* previous = nullptr;
  for (const auto& tensor : header.tensors) {
    if (tensor.begin < covered)
      refuse(file, tensor.name, "data_offsets " + range(tensor.begin, tensor.end) + " overlap tensor '" +
                                    previous->name + "' at " + range(previous->begin, previous->end));
    if (tensor.begin > covered)
      refuse(file, tensor.name, "data_offsets " + range(tensor.begin, tensor.end) + " leave a hole " +
                                    range(covered, tensor.begin) + " in the data section");
    covered = tensor.end;
    previous = &tensor;
  }
  if (covered != data_bytes)
    refuse(file, "", "tensors cover " + range(0, covered) + " but the data section has " + std::to_string(data_bytes) +
                         " bytes (trailing bytes after the last tensor)");
  return header;
}

}  // namespace tessera::io
