// weight_sync_options(config): a config file's [tessera.rollout] sets the weight sync's replica
// policy, staging budget and timeout; without the section, and in a default WeightSyncOptions, they
// are the same defaults (RolloutConfig's). One process, no jobs.

#include <chrono>
#include <string>

#include "actors/rollout/weight_sync.h"
#include "core/config/load.h"
#include "core/error.h"
// Last: the headers above bring LibTorch, whose logging defines a glog-style CHECK; Catch's must win.
#include <catch2/catch.hpp>

// LibTorch's headers (through weight_sync.h) define glog's CHECK over Catch's: REQUIRE here.
using namespace tessera;
using affine::ReplicaPolicyKind;

namespace {

config::Config toml(const std::string& text) { return config::load_config_text(text, config::Format::toml, "sync.toml"); }

std::string config_error(const std::string& text) {
  try {
    toml(text);
  } catch (const ConfigError& e) {
    return e.what();
  }
  FAIL("expected a ConfigError");
  return {};
}

}  // namespace

TEST_CASE("[tessera.rollout] sets the sync's policy, staging budget and timeout", "[sync_options]") {
  WeightSyncOptions base;
  base.train_job = "train";
  base.rollout_job = "rollout";
  base.session = "s";
  base.delta = true;
  base.streaming_copy_bytes = 7;
  const auto o = weight_sync_options(toml("[tessera.rollout]\nreplica_policy = \"local\"\n"
                                          "staging_budget_bytes = 1048576\nsync_timeout_ms = 5000\n"),
                                     base);
  REQUIRE(o.replica_policy == ReplicaPolicyKind::local);
  REQUIRE(o.staging_bytes == 1048576);
  REQUIRE(o.timeout == std::chrono::milliseconds(5000));
  // The program's own options are kept.
  REQUIRE(o.train_job == "train");
  REQUIRE(o.rollout_job == "rollout");
  REQUIRE(o.session == "s");
  REQUIRE(o.delta);
  REQUIRE(o.streaming_copy_bytes == 7);

  // Names are matched as the other enums' (case-insensitive); one key alone leaves the others at their defaults.
  const WeightSyncOptions defaults;
  const auto b = weight_sync_options(toml("[tessera.rollout]\nreplica_policy = \"Balanced\"\n"));
  REQUIRE(b.replica_policy == ReplicaPolicyKind::balanced);
  REQUIRE(b.staging_bytes == defaults.staging_bytes);
  REQUIRE(b.timeout == defaults.timeout);
}

TEST_CASE("configs/autotp.toml's [tessera.rollout] reaches the sync", "[sync_options]") {
  const auto o = weight_sync_options(config::load_config(std::string(TESSERA_SOURCE_DIR) + "/configs/autotp.toml"));
  REQUIRE(o.replica_policy == ReplicaPolicyKind::balanced);
  REQUIRE(o.staging_bytes == int64_t{256} << 20);
  REQUIRE(o.timeout == std::chrono::minutes(10));
}

TEST_CASE("the default policy is lowest, with or without a config", "[sync_options]") {
  const WeightSyncOptions defaults;
  REQUIRE(defaults.replica_policy == ReplicaPolicyKind::lowest);
  REQUIRE(std::string(affine::name_of(defaults.replica_policy)) == "lowest");
  REQUIRE(defaults.replica_policy == affine::kDefaultReplicaPolicy);
  REQUIRE(defaults.replica_policy == affine::ReplicaPolicy{}.kind);  // the planner's default too

  const auto o = weight_sync_options(toml("train_micro_batch_size_per_gpu = 1\n"));  // no [tessera.rollout]
  REQUIRE(o.replica_policy == ReplicaPolicyKind::lowest);
  REQUIRE(o.staging_bytes == defaults.staging_bytes);
  REQUIRE(o.timeout == defaults.timeout);
  REQUIRE(defaults.staging_bytes == config::RolloutConfig{}.staging_budget_bytes);
  REQUIRE(defaults.timeout == std::chrono::milliseconds(config::RolloutConfig{}.sync_timeout_ms));
}

TEST_CASE("a bad replica policy is refused, naming the key", "[sync_options]") {
  const auto bad = config_error("[tessera.rollout]\nreplica_policy = \"nearest\"\n");
  CHECK_THAT(bad, Catch::Contains("sync.toml:2: tessera.rollout.replica_policy"));
  CHECK_THAT(bad, Catch::Contains("expected one of lowest, local, balanced"));
  // callback has no name: it needs code on both jobs.
  CHECK_THAT(config_error("[tessera.rollout]\nreplica_policy = \"callback\"\n"),
             Catch::Contains("tessera.rollout.replica_policy"));
  CHECK_THAT(config_error("[tessera.rollout]\nsync_timeout_ms = 0\n"), Catch::Contains("tessera.rollout.sync_timeout_ms"));
}
