// The key registry: what tessera does with each DeepSpeed key it does not model as a typed field.
//
// tessera is swapped in for DeepSpeed in existing pipelines, so it must know DeepSpeed's whole key
// set (deepspeed.ai/docs/config-json and DeepSpeed's config classes), not only the keys it acts on.
// Every key of a file is exactly one of:
//   modelled     a field of Config (detail/fields.h lists them);
//   ignored      DeepSpeed accepts it, and not acting on it changes no result (profilers, monitors,
//                logging, I/O tuning, checkpoint-format switches): accepted with a one-line warning;
//   unsupported  it asks for a feature tessera does not have yet and ignoring it would change
//                results (1-bit optimizers, sparse attention, curriculum learning, ...): loaded and
//                listed, refused when the engine starts (refuse_unsupported in validate.h). A value
//                equal to DeepSpeed's default asks for nothing (prescale_gradients false) and is
//                treated as ignored;
//   alias        an old spelling (stage3_gather_fp16_weights_on_model_save): read as its target;
//   comment      starts with "_";
//   a typo       anything else: an error that suggests the closest known key.
//
// Example: in section "zero_optimization", "round_robin_gradients" is ignored, "mics_shard_size"
// is unsupported unless it is -1, "prefetch_bucket_size" is an alias of
// "stage3_prefetch_bucket_size", and "stage3_prefetch_bucket_sise" is a typo whose suggestion is
// "stage3_prefetch_bucket_size".
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::config {

struct Node;

enum class KeyKind {
  ignored,          // the key (and, for a table, everything under it) is accepted and not acted on
  unsupported,      // asks for a missing feature unless its value is inert
  alias,            // another name of a modelled key
};

struct KeyRule {
  const char* section;  // dotted path of the table holding the key; "" = top level
  const char* name;
  KeyKind kind;
  // unsupported: the inert value as JSON ("false", "1.0", "null"), or "field:enabled" for a table
  // that asks for nothing unless its "enabled" is set, or "" when every value asks for the feature.
  // alias: the modelled key it stands for.
  const char* detail;
  const char* why;  // unsupported: what tessera lacks; ignored: why it makes no difference
};

// The rule for `name` in `section`, or nullptr for keys the registry does not list.
const KeyRule* find_key_rule(std::string_view section, std::string_view name);

// Every registry key name of `section` (for suggestions).
std::vector<std::string> registry_keys(std::string_view section);

// Whether `value` of an unsupported key asks for nothing (equals DeepSpeed's default).
bool is_inert(const KeyRule& rule, const Node& value);

// Optimizer and scheduler types DeepSpeed has and tessera does not (yet): "OneBitAdam", ...
bool is_deepspeed_only_optimizer(std::string_view type);
bool is_deepspeed_only_scheduler(std::string_view type);

// The candidate nearest to `word` by edit distance (case-insensitive), or "" when none is close
// enough to be a plausible typo (distance at most max(2, length/3)).
std::string closest_key(std::string_view word, const std::vector<std::string>& candidates);

// Levenshtein distance, case-insensitive.
int edit_distance(std::string_view a, std::string_view b);

}  // namespace tessera::config
