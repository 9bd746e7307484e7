// Provenance says, for every value of a Config, where it came from: written in the file (given),
// DeepSpeed's default because the file left the key out (default), computed from other values or
// facts (derived), or still "auto" and waiting for a fact known only when the engine starts.
//
// Keys are dotted paths as the files spell them ("zero_optimization.offload_param.device").
// The note says why: for derived values the arithmetic, for auto values the fact awaited.
//
// Example: after loading {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
// "zero_optimization": {"reduce_bucket_size": "auto"}} and resolving with world size 8, hidden 1024:
//   train_micro_batch_size_per_gpu      given
//   train_batch_size                    derived  "4 x 2 x 8 (micro x accumulation x data-parallel size)"
//   zero_optimization.reduce_bucket_size derived "hidden size 1024 squared"
//   zero_optimization.sub_group_size    default
// and before resolving, reduce_bucket_size is  auto  "the model's hidden size (--hidden-size)".
#pragma once

#include <map>
#include <string>

namespace tessera::config {

enum class Origin { given, default_value, derived, pending_auto };

const char* name_of(Origin origin);  // "given", "default", "derived", "auto"

struct Mark {
  Origin origin = Origin::default_value;
  std::string note;  // derivation, or the fact an auto value waits for; may be empty
  int line = 0;      // where a given value was written (TOML); 0 = unknown
};

class Provenance {
 public:
  void set(const std::string& path, Origin origin, std::string note = {}, int line = 0) {
    marks_[path] = Mark{origin, std::move(note), line};
  }
  // The mark of `path`; a path never recorded counts as a default.
  Mark get(const std::string& path) const {
    auto it = marks_.find(path);
    return it == marks_.end() ? Mark{} : it->second;
  }
  bool has(const std::string& path) const { return marks_.count(path) != 0; }
  const std::map<std::string, Mark>& all() const { return marks_; }

 private:
  std::map<std::string, Mark> marks_;
};

}  // namespace tessera::config
