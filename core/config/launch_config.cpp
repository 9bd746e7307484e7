#include "core/config/launch_config.h"

#include <cstdlib>
#include <sstream>

#include "core/config/load.h"
#include "core/error.h"

namespace tessera::config {
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::string text_of(std::int64_t v) { return std::to_string(v); }
std::string text_of(bool v) { return v ? "true" : "false"; }
std::string text_of(OffloadDevice v) { return std::string("\"") + name_of(v) + "\""; }
std::string text_of(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}
std::string text_of(const std::string& v) { return "\"" + v + "\""; }

// One plugin variable: the program's "auto" takes the launcher's value; a fixed one must equal it.
class Reconciler {
 public:
  Reconciler(const LaunchConfig& launched, const std::string& program, Provenance& provenance)
      : launched_(launched), program_(program), provenance_(provenance) {}

  bool set(const std::string& field) const {
    for (const auto& f : launched_.plugin_fields)
      if (f == field) return true;
    return false;
  }

  // A key the program left out or wrote "auto" takes the file's value.
  template <typename T>
  void settle(const std::string& key, Auto<T>& mine, const Auto<T>& theirs) {
    if (mine.is_auto || !given(key)) {
      mine = theirs;
      provenance_.set(key, Origin::derived, "from " + launched_.origin);
    } else if (!theirs.is_auto && !(mine.value == theirs.value)) {
      conflict(key, text_of(mine.value), text_of(theirs.value));
    }
  }

  void settle(const std::string& key, std::string& mine, const std::string& theirs) {
    if (!given(key)) {
      mine = theirs;
      provenance_.set(key, Origin::derived, "from " + launched_.origin);
    } else if (mine != theirs) {
      conflict(key, text_of(mine), text_of(theirs));
    }
  }

  void raise_if_any() const {
    if (lines_.empty()) return;
    std::string message = program_ + " and the launcher's config from " + launched_.origin +
                          " disagree (one of them would be ignored):";
    for (const auto& l : lines_) message += "\n  " + l;
    throw ConfigError(message + "\nMake them agree, write \"auto\" in " + program_ +
                      " (the Accelerate file then fills it), or leave the program's config out");
  }

 private:
  bool given(const std::string& key) const { return provenance_.get(key).origin == Origin::given; }
  void conflict(const std::string& key, const std::string& mine, const std::string& theirs) {
    lines_.push_back(key + " is " + mine + " in " + program_ + " but " + theirs + " in the Accelerate file");
  }
  const LaunchConfig& launched_;
  std::string program_;
  Provenance& provenance_;
  std::vector<std::string> lines_;
};

}  // namespace

std::optional<LaunchConfig> launch_config_from_env() {
  const std::string json = env("TESSERA_LAUNCH_CONFIG_JSON");
  if (json.empty()) return std::nullopt;
  LaunchConfig out;
  out.json = json;
  out.origin = env("TESSERA_LAUNCH_CONFIG_ORIGIN");
  if (out.origin.empty()) out.origin = "TESSERA_LAUNCH_CONFIG_JSON";
  out.config = load_config_text(json, Format::json, out.origin);
  out.plugin_fields = split_commas(env("TESSERA_LAUNCH_DS_FIELDS"));
  out.zero3_init = env("TESSERA_ZERO3_INIT") == "1";
  return out;
}

Config reconcile_with_launch(Config config, const LaunchConfig& launched) {
  Reconciler r(launched, config.source.empty() ? std::string("the program's config") : config.source,
               config.provenance);
  const Config& l = launched.config;
  auto& z = config.zero_optimization;
  const auto& lz = l.zero_optimization;
  if (r.set("zero_stage")) r.settle("zero_optimization.stage", z.stage, lz.stage);
  if (r.set("gradient_accumulation_steps"))
    r.settle("gradient_accumulation_steps", config.gradient_accumulation_steps, l.gradient_accumulation_steps);
  if (r.set("gradient_clipping")) r.settle("gradient_clipping", config.gradient_clipping, l.gradient_clipping);
  if (r.set("offload_optimizer_device"))
    r.settle("zero_optimization.offload_optimizer.device", z.offload_optimizer.device, lz.offload_optimizer.device);
  if (r.set("offload_optimizer_nvme_path"))
    r.settle("zero_optimization.offload_optimizer.nvme_path", z.offload_optimizer.nvme_path, lz.offload_optimizer.nvme_path);
  if (r.set("offload_param_device"))
    r.settle("zero_optimization.offload_param.device", z.offload_param.device, lz.offload_param.device);
  if (r.set("offload_param_nvme_path"))
    r.settle("zero_optimization.offload_param.nvme_path", z.offload_param.nvme_path, lz.offload_param.nvme_path);
  if (r.set("zero3_save_16bit_model"))
    r.settle("zero_optimization.stage3_gather_16bit_weights_on_model_save", z.stage3_gather_16bit_weights_on_model_save,
             lz.stage3_gather_16bit_weights_on_model_save);
  r.raise_if_any();
  return config;
}

Config program_config(const std::string& path, const std::optional<LaunchConfig>& launched, const std::string& who) {
  if (!path.empty()) return launched ? reconcile_with_launch(load_config(path), *launched) : load_config(path);
  if (!launched)
    throw ConfigError("no config: give " + who + " (a tessera TOML or DeepSpeed JSON file), or start the program "
                      "with tessera-launch --config_file ACCELERATE.yaml");
  return launched->config;
}

}  // namespace tessera::config
