// A DType names the element type of a buffer; the affine layer only needs its size in bytes.
//
// Maps and plans are dtype-free in their arithmetic (offsets, strides and extents count elements);
// the dtype travels with them so the executor can refuse a buffer of another type and convert
// element counts to bytes. No LibTorch here: transport/ converts c10::ScalarType at its boundary.
//
// Example: a (4096, 4096) bf16 weight is 16,777,216 elements; element_size(DType::bf16) == 2, so its
// buffer is 33,554,432 bytes.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::affine {

enum class DType : uint8_t { f32, f16, bf16, f64, i8, u8, i16, i32, i64, bool8 };

// Bytes per element: f32 4, f16 2, bf16 2, f64 8, i8 1, u8 1, i16 2, i32 4, i64 8, bool8 1.
int64_t element_size(DType dtype);
// Short names used in JSON and messages: "f32", "f16", "bf16", ...
const char* dtype_name(DType dtype);
// Inverse of dtype_name; also accepts torch spellings ("float32", "bfloat16", "float16", "float").
// Throws tessera::MapError naming the unknown string.
DType parse_dtype(const std::string& name);

}  // namespace tessera::affine
