// UCX, TOML and JSON checks for `tessera doctor`.
#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <stdexcept>
#include <string>

#include "tools/tessera/doctor/checks.h"
#include "transport/ucx/ucx_context.h"

namespace tessera::cli::doctor {

std::string check_ucx() {
  transport::UcxContext context({});
  auto transports = transport::ucx_transports();
  if (transports.empty()) throw std::runtime_error("UCX found no transport");
  std::string list;
  for (const auto& t : transports) list += (list.empty() ? "" : ", ") + t;
  return "context + worker up; transports: " + list;
}

std::string toml_version() {
  return std::to_string(TOML_LIB_MAJOR) + "." + std::to_string(TOML_LIB_MINOR) + "." + std::to_string(TOML_LIB_PATCH);
}

std::string check_toml() {
  auto table = toml::parse(std::string_view{"[zero_optimization]\nstage = 3\n"}, std::string_view{"doctor.toml"});
  auto stage = table["zero_optimization"]["stage"].value<int64_t>();
  if (stage != 3) throw std::runtime_error("parsed zero_optimization.stage != 3");
  return "parsed zero_optimization.stage = 3";
}

std::string check_json() {
  auto doc = nlohmann::json::parse(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})");
  if (doc["zero_optimization"]["stage"].get<int>() != 2) throw std::runtime_error("parsed stage != 2");
  return "nlohmann_json " + std::to_string(NLOHMANN_JSON_VERSION_MAJOR) + "." +
         std::to_string(NLOHMANN_JSON_VERSION_MINOR) + "." + std::to_string(NLOHMANN_JSON_VERSION_PATCH) +
         ": parsed a DeepSpeed snippet";
}

}  // namespace tessera::cli::doctor
