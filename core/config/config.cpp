#include "core/config/config.h"

#include "core/config/detail/enum_names.h"
#include "core/config/detail/errors.h"
#include "core/error.h"

namespace tessera::config {

const char* name_of(OffloadDevice v) { return detail::enum_name(v); }
const char* name_of(OptimizerType v) { return detail::enum_name(v); }
const char* name_of(SchedulerType v) { return detail::enum_name(v); }
const char* name_of(PartitionType v) { return detail::enum_name(v); }
const char* name_of(TransportBackend v) { return detail::enum_name(v); }
const char* name_of(TagValidation v) { return detail::enum_name(v); }

std::string canonical_dtype(const std::string& spelling) {
  const std::string s = spelling.rfind("torch.", 0) == 0 ? spelling.substr(6) : spelling;
  if (s == "fp32" || s == "float32" || s == "float") return "fp32";
  if (s == "fp16" || s == "float16" || s == "half") return "fp16";
  if (s == "bf16" || s == "bfloat16") return "bf16";
  return "";
}

const char* name_of(Origin origin) {
  switch (origin) {
    case Origin::given: return "given";
    case Origin::default_value: return "default";
    case Origin::derived: return "derived";
    case Origin::pending_auto: return "auto";
  }
  return "?";
}

namespace detail {
void ErrorList::raise_if_any() const {
  if (lines_.empty()) return;
  if (lines_.size() == 1) throw ConfigError(lines_.front());
  std::string message = std::to_string(lines_.size()) + " configuration errors:";
  for (const std::string& line : lines_) message += "\n  " + line;
  throw ConfigError(message);
}
}  // namespace detail

}  // namespace tessera::config
