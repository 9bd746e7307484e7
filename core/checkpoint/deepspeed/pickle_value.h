// A PickleValue is what the restricted unpickler (restricted_unpickler.h) builds from a torch.save
// pickle: plain data only. Python objects of the few classes DeepSpeed's checkpoints contain become
// data too: an OrderedDict is a dict, torch.Size a tuple, a set a list-like set, a LossScaler or a
// fragment_address an `object` (its class name and its attribute dict), a ZeroStageEnum member an
// `enum_member` (its name and value), a tensor a TensorRef into a storage record of the archive.
// Nothing is ever called or imported to build one.
//
// Values are shared (a pickle's memo refers to one value from several places) and immutable once
// the unpickler returns. Dict keys keep their pickle order.
//
// Example: {'step': tensor(5.), 'lr': 0.001} is a dict of 2 entries: ("step", tensor: storage "0",
// f32, shape [], offset 0) and ("lr", floating 0.001).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/dtype.h"

namespace tessera::checkpoint::deepspeed {

struct PickleValue;
using PickleRef = std::shared_ptr<const PickleValue>;

// A storage record of the archive: data/<key>, `elements` of `dtype`.
struct StorageRef {
  std::string key;
  affine::DType dtype = affine::DType::f32;
  int64_t elements = 0;
};

// torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...): a strided view of a storage.
struct TensorRef {
  StorageRef storage;
  int64_t offset = 0;                // in elements
  std::vector<int64_t> shape, strides;
  int64_t elements() const;
  bool contiguous() const;           // row-major without gaps (what DeepSpeed saves)
};

enum class PickleKind { none, boolean, integer, floating, string, list, tuple, dict, set, storage, tensor, object,
                        enum_member, global };

const char* kind_name(PickleKind kind);

struct PickleValue {
  PickleKind kind = PickleKind::none;
  bool boolean = false;
  int64_t integer = 0;               // integer; an enum member's value
  double floating = 0;
  std::string text;                  // string; an object's or a global's class ("module.Name"); an enum member's name
  std::vector<PickleRef> items;      // list, tuple, set
  std::vector<std::pair<PickleRef, PickleRef>> entries;  // dict; an object's attributes (string keys)
  StorageRef storage;                // storage
  TensorRef tensor;                  // tensor

  // Lookups by string key in a dict or an object's attributes; `where` names the file for errors.
  const PickleValue* find(const std::string& key) const;
  const PickleValue& at(const std::string& key, const std::string& where) const;
  // Lookups by integer key in a dict (optimizer states are keyed by index).
  const PickleValue& at(int64_t key, const std::string& where) const;
  bool is_none() const { return kind == PickleKind::none; }
  // Typed reads: CheckpointError naming `where` and the kind found.
  int64_t as_int(const std::string& where) const;       // integer or boolean
  double as_double(const std::string& where) const;     // floating or integer
  bool as_bool(const std::string& where) const;
  const std::string& as_string(const std::string& where) const;
  const std::vector<PickleRef>& as_sequence(const std::string& where) const;  // list, tuple or set
  const TensorRef& as_tensor(const std::string& where) const;
};

// A short rendering for messages and debugging (tensors as "f32[64, 256]", long containers cut).
std::string describe(const PickleValue& value, int depth = 2);

}  // namespace tessera::checkpoint::deepspeed
