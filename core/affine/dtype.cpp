#include "core/affine/dtype.h"

#include "core/affine/errors.h"

namespace tessera::affine {

int64_t element_size(DType dtype) {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::f64: return 8;
    case DType::i8: return 1;
    case DType::u8: return 1;
    case DType::i16: return 2;
    case DType::i32: return 4;
    case DType::i64: return 8;
    case DType::bool8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f64: return "f64";
    case DType::i8: return "i8";
    case DType::u8: return "u8";
    case DType::i16: return "i16";
    case DType::i32: return "i32";
    case DType::i64: return "i64";
    case DType::bool8: return "bool";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  static const struct { const char* name; DType dtype; } kNames[] = {
      {"f32", DType::f32},     {"float32", DType::f32},   {"float", DType::f32},
      {"f16", DType::f16},     {"float16", DType::f16},   {"half", DType::f16},
      {"bf16", DType::bf16},   {"bfloat16", DType::bf16}, {"f64", DType::f64},
      {"float64", DType::f64}, {"double", DType::f64},    {"i8", DType::i8},
      {"int8", DType::i8},     {"u8", DType::u8},         {"uint8", DType::u8},
      {"i16", DType::i16},     {"int16", DType::i16},     {"i32", DType::i32},
      {"int32", DType::i32},   {"i64", DType::i64},       {"int64", DType::i64},
      {"bool", DType::bool8}};
  for (const auto& entry : kNames) {
    if (name == entry.name) return entry.dtype;
  }
  throw FormatError("unknown dtype '" + name + "' (expected f32, f16, bf16, f64, i8, u8, i16, i32, i64 or bool)");
}

}  // namespace tessera::affine
