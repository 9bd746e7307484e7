#include "core/checkpoint/deepspeed/pickle_value.h"

#include <sstream>

#include "core/error.h"

namespace tessera::checkpoint::deepspeed {

int64_t TensorRef::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

bool TensorRef::contiguous() const {
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && strides[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

const char* kind_name(PickleKind kind) {
  switch (kind) {
    case PickleKind::none: return "None";
    case PickleKind::boolean: return "bool";
    case PickleKind::integer: return "int";
    case PickleKind::floating: return "float";
    case PickleKind::string: return "str";
    case PickleKind::list: return "list";
    case PickleKind::tuple: return "tuple";
    case PickleKind::dict: return "dict";
    case PickleKind::set: return "set";
    case PickleKind::storage: return "storage";
    case PickleKind::tensor: return "tensor";
    case PickleKind::object: return "object";
    case PickleKind::enum_member: return "enum member";
    case PickleKind::global: return "global";
  }
  return "?";
}

namespace {

[[noreturn]] void wrong(const PickleValue& v, const char* expected, const std::string& where) {
  throw CheckpointError(where + ": expected " + expected + ", found " + kind_name(v.kind) + " (" + describe(v, 1) + ")");
}

}  // namespace

const PickleValue* PickleValue::find(const std::string& key) const {
  if (kind != PickleKind::dict && kind != PickleKind::object) return nullptr;
  for (const auto& [k, v] : entries)
    if (k->kind == PickleKind::string && k->text == key) return v.get();
  return nullptr;
}

const PickleValue& PickleValue::at(const std::string& key, const std::string& where) const {
  if (kind != PickleKind::dict && kind != PickleKind::object) wrong(*this, "a dict", where + " ['" + key + "']");
  if (const auto* v = find(key)) return *v;
  throw CheckpointError(where + ": has no key '" + key + "'");
}

const PickleValue& PickleValue::at(int64_t key, const std::string& where) const {
  if (kind != PickleKind::dict) wrong(*this, "a dict", where);
  for (const auto& [k, v] : entries)
    if (k->kind == PickleKind::integer && k->integer == key) return *v;
  throw CheckpointError(where + ": has no key " + std::to_string(key));
}

int64_t PickleValue::as_int(const std::string& where) const {
  if (kind == PickleKind::integer) return integer;
  if (kind == PickleKind::boolean) return boolean ? 1 : 0;
  wrong(*this, "an int", where);
}

double PickleValue::as_double(const std::string& where) const {
  if (kind == PickleKind::floating) return floating;
  if (kind == PickleKind::integer) return double(integer);
  wrong(*this, "a float", where);
}

bool PickleValue::as_bool(const std::string& where) const {
  if (kind == PickleKind::boolean) return boolean;
  wrong(*this, "a bool", where);
}

const std::string& PickleValue::as_string(const std::string& where) const {
  if (kind == PickleKind::string) return text;
  wrong(*this, "a str", where);
}

const std::vector<PickleRef>& PickleValue::as_sequence(const std::string& where) const {
  if (kind == PickleKind::list || kind == PickleKind::tuple || kind == PickleKind::set) return items;
  wrong(*this, "a list", where);
}

const TensorRef& PickleValue::as_tensor(const std::string& where) const {
  if (kind == PickleKind::tensor) return tensor;
  wrong(*this, "a tensor", where);
}

std::string describe(const PickleValue& v, int depth) {
  std::ostringstream out;
  auto dims = [&](const std::vector<int64_t>& d) {
    out << "[";
    for (size_t i = 0; i < d.size(); ++i) out << (i ? ", " : "") << d[i];
    out << "]";
  };
  switch (v.kind) {
    case PickleKind::none: return "None";
    case PickleKind::boolean: return v.boolean ? "True" : "False";
    case PickleKind::integer: return std::to_string(v.integer);
    case PickleKind::floating: out << v.floating; return out.str();
    case PickleKind::string: return "'" + v.text + "'";
    case PickleKind::storage: return std::string("storage ") + affine::dtype_name(v.storage.dtype) + "[" +
                                     std::to_string(v.storage.elements) + "]";
    case PickleKind::tensor: out << affine::dtype_name(v.tensor.storage.dtype); dims(v.tensor.shape); return out.str();
    case PickleKind::enum_member: return v.text + " (= " + std::to_string(v.integer) + ")";
    case PickleKind::global: return "global " + v.text;
    default: break;
  }
  const bool mapping = v.kind == PickleKind::dict || v.kind == PickleKind::object;
  if (v.kind == PickleKind::object) out << v.text;
  out << (mapping ? "{" : v.kind == PickleKind::tuple ? "(" : "[");
  const size_t n = mapping ? v.entries.size() : v.items.size();
  if (depth <= 0 && n) out << "...";
  for (size_t i = 0; depth > 0 && i < n && i < 8; ++i) {
    out << (i ? ", " : "");
    if (mapping) out << describe(*v.entries[i].first, 0) << ": " << describe(*v.entries[i].second, depth - 1);
    else out << describe(*v.items[i], depth - 1);
  }
  if (depth > 0 && n > 8) out << ", ... (" << n << ")";
  out << (mapping ? "}" : v.kind == PickleKind::tuple ? ")" : "]");
  return out.str();
}

}  // namespace tessera::checkpoint::deepspeed
