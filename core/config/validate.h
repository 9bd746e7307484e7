// Validation checks the rules that span keys or ranges of values, after decoding has checked each
// key's type: value ranges, the ZeRO stage / offload rules, precision modes that exclude each
// other, scheduler requirements, AutoTP limits and the tessera section.
//
// Rules that involve an "auto" value are checked again once resolve_auto has filled it. Every
// problem found is reported in one ConfigError, one line each: FILE[:LINE]: KEY.PATH: message.
//
// Example: {"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}} fails with
//   ds.json:1: zero_optimization.offload_param.device: "cpu" needs ZeRO stage 3 (parameters are
//   partitioned only in stage 3), but zero_optimization.stage is 2
//
// Validation also lists in Config::unsupported the modelled settings whose feature tessera does
// not have yet (DeepCompile, ZeRO++ quantization and hierarchical partitioning), and
// refuse_unsupported turns that list into an error when an engine starts.
#pragma once

#include "core/config/config.h"

namespace tessera::config {

// Throws ConfigError listing every problem; adds warnings and not-yet-supported entries to config.
void validate(Config& config);

// Throws ConfigError when config.unsupported is not empty, naming each key, its value and the
// missing feature. Engines call this before they touch anything.
void refuse_unsupported(const Config& config);

}  // namespace tessera::config
