// The key registry and the typo suggestions.
#include <catch2/catch.hpp>

#include "core/config/keys.h"
#include "core/config/load.h"
#include "core/config/node.h"

using namespace tessera::config;

TEST_CASE("edit distance", "[config][keys]") {
  CHECK(edit_distance("", "") == 0);
  CHECK(edit_distance("stage", "stage") == 0);
  CHECK(edit_distance("stage", "Stage") == 0);  // case-insensitive
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("", "abc") == 3);
}

TEST_CASE("closest key suggests plausible typos only", "[config][keys]") {
  const std::vector<std::string> keys = {"reduce_bucket_size", "allgather_bucket_size", "stage"};
  CHECK(closest_key("reduce_bucket_sise", keys) == "reduce_bucket_size");
  CHECK(closest_key("stag", keys) == "stage");
  CHECK(closest_key("completely_different", keys).empty());
}

TEST_CASE("registry kinds", "[config][keys]") {
  const KeyRule* rule = find_key_rule("zero_optimization", "round_robin_gradients");
  REQUIRE(rule != nullptr);
  CHECK(rule->kind == KeyKind::ignored);
  rule = find_key_rule("zero_optimization", "stage3_gather_fp16_weights_on_model_save");
  REQUIRE(rule != nullptr);
  CHECK(rule->kind == KeyKind::alias);
  CHECK(std::string(rule->detail) == "stage3_gather_16bit_weights_on_model_save");
  rule = find_key_rule("", "prescale_gradients");
  REQUIRE(rule != nullptr);
  CHECK(is_inert(*rule, Node::of(false)));
  CHECK_FALSE(is_inert(*rule, Node::of(true)));
  rule = find_key_rule("", "gradient_predivide_factor");
  CHECK(is_inert(*rule, Node::of(std::int64_t{1})));
  CHECK_FALSE(is_inert(*rule, Node::of(2.0)));
  rule = find_key_rule("", "amp");
  Node amp = Node::make_table();
  amp.set("enabled", Node::of(false));
  CHECK(is_inert(*rule, amp));
  amp.set("enabled", Node::of(true));
  CHECK_FALSE(is_inert(*rule, amp));
  CHECK(find_key_rule("", "train_batch_size") == nullptr);  // modelled keys are not in the registry
  CHECK(is_deepspeed_only_optimizer("OneBitAdam"));
  CHECK_FALSE(is_deepspeed_only_optimizer("AdamW"));
}

TEST_CASE("every alias in the registry reads as a modelled key", "[config][keys]") {
  // An alias whose target is not modelled would be reported as a typo of itself.
  int aliases = 0;
  for (const std::string section : {"", "zero_optimization"}) {
    for (const std::string& key : registry_keys(section)) {
      const KeyRule* rule = find_key_rule(section, key);
      if (rule->kind != KeyKind::alias) continue;
      ++aliases;
      const std::string value = std::string(rule->detail) == "bf16" ? "{\"enabled\": false}"
                                : key.find("gather") != std::string::npos ? "true"
                                                                          : "1000";
      const std::string inner = "\"" + key + "\": " + value;
      const std::string text = section.empty() ? "{" + inner + "}" : "{\"" + section + "\": {\"stage\": 3, " + inner + "}}";
      INFO(text);
      const Config c = load_config_text(text, Format::json, "alias.json");
      CHECK(c.warnings.size() == 1);
      CHECK_THAT(c.warnings.at(0), Catch::Contains("read as"));
    }
  }
  CHECK(aliases >= 7);
}
