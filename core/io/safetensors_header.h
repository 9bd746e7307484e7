// A safetensors header is the JSON table of contents of a Hugging Face safetensors file: for each
// tensor its dtype, shape and byte range in the data section, plus optional string metadata.
//
// File layout (little-endian): [8-byte N][N bytes of JSON, space-padded][data section]. The JSON
// is one object: {"__metadata__": {"k": "v"}, "wte.weight": {"dtype": "F32", "shape": [256, 64],
// "data_offsets": [0, 65536]}, ...}. Offsets are relative to the data section, end exclusive.
//
// Invariants of a parsed StHeader (the parser refuses anything else, like the reference Rust
// implementation): every tensor's end - begin == numel * element_size; the tensors, sorted by
// begin, tile [0, data_bytes) exactly (no overlap, no hole, no trailing bytes); names are unique.
// Example: a F32 [2, 3] tensor then a BF16 [4]: offsets [0, 24) and [24, 32), data_bytes = 32.
//
// Plain C++ without LibTorch, so the parser can be fuzzed cheaply. Errors: tessera::CheckpointError
// naming the file and, where there is one, the tensor; no other exception type escapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::io {

// The dtypes tessera reads and writes ("F32", "F16", "BF16", "F64", "I64", "I32", "I16", "I8",
// "U8", "BOOL" in the file).
enum class StDtype { f32, f16, bf16, f64, i64, i32, i16, i8, u8, boolean };

size_t element_size(StDtype dtype);
const char* dtype_name(StDtype dtype);  // the file's spelling, "BF16"

struct StTensorInfo {
  std::string name;
  StDtype dtype = StDtype::f32;
  std::vector<int64_t> shape;  // [] for a 0-d scalar
  uint64_t begin = 0, end = 0;  // byte offsets relative to the data section, end exclusive

  uint64_t bytes() const { return end - begin; }
};

struct StHeader {
  std::vector<StTensorInfo> tensors;  // sorted by (begin, end, name)
  std::map<std::string, std::string> metadata;
  uint64_t header_bytes = 0;  // N, the JSON's length including padding
  uint64_t data_bytes = 0;    // file size - 8 - N

  // The tensor called `name`, or nullptr. Linear in the number of tensors.
  const StTensorInfo* find(const std::string& name) const;
};

// Parses and validates the N header bytes `json` of a file whose data section has `data_bytes`
// bytes. `file` only names the file in error messages.
StHeader parse_safetensors_header(std::string_view json, uint64_t data_bytes, const std::string& file);

}  // namespace tessera::io
