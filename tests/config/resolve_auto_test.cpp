// resolve_auto: batch arithmetic (train = micro x accumulation x dp) and the hidden-size rules.
#include <catch2/catch.hpp>

#include "core/config/resolve_auto.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::config_error;
using tessera::config::test::load_json;

namespace {
Facts world(std::int64_t n) {
  Facts f;
  f.world_size = n;
  return f;
}
struct Batch {
  std::int64_t train, micro, accumulation;
};
Batch batch_of(const Config& c) {
  return {c.train_batch_size.value, c.train_micro_batch_size_per_gpu.value, c.gradient_accumulation_steps.value};
}
}  // namespace

TEST_CASE("any two batch values determine the third", "[config][auto]") {
  // micro 4, accumulation 2, 8 ranks: 4 x 2 x 8 = 64.
  auto r = batch_of(resolve_auto(load_json(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"), world(8)));
  CHECK(r.train == 64);
  // 64 / (4 x 8) = 2
  r = batch_of(resolve_auto(load_json(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4})"), world(8)));
  CHECK(r.accumulation == 2);
  // 64 / (2 x 8) = 4
  r = batch_of(resolve_auto(load_json(R"({"train_batch_size": 64, "gradient_accumulation_steps": 2})"), world(8)));
  CHECK(r.micro == 4);
  // all three consistent
  r = batch_of(resolve_auto(load_json(R"({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4,
                                          "gradient_accumulation_steps": 2})"), world(8)));
  CHECK(r.train == 64);
}

TEST_CASE("DeepSpeed's one-value rules: accumulation defaults to 1", "[config][auto]") {
  auto r = batch_of(resolve_auto(load_json(R"({"train_batch_size": 32})"), world(8)));
  CHECK(r.accumulation == 1);
  CHECK(r.micro == 4);  // 32 / 8
  r = batch_of(resolve_auto(load_json(R"({"train_micro_batch_size_per_gpu": 3})"), world(8)));
  CHECK(r.accumulation == 1);
  CHECK(r.train == 24);
}

TEST_CASE("auto batch values come from facts, then arithmetic", "[config][auto]") {
  Facts f = world(4);
  f.micro_batch_size = 6;
  auto r = batch_of(resolve_auto(load_json(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                                              "gradient_accumulation_steps": 3})"), f));
  CHECK(r.micro == 6);
  CHECK(r.train == 72);  // 6 x 3 x 4
  // An auto accumulation is derived from the other two, not defaulted.
  r = batch_of(resolve_auto(load_json(R"({"train_batch_size": 48, "train_micro_batch_size_per_gpu": 6,
                                          "gradient_accumulation_steps": "auto"})"), world(4)));
  CHECK(r.accumulation == 2);
  // The user's batch size fills a file that gives no batch at all (the ZeRO++ example).
  f = world(2);
  f.micro_batch_size = 5;
  r = batch_of(resolve_auto(load_json(R"({"zero_optimization": {"stage": 1}})"), f));
  CHECK(r.train == 10);
}

TEST_CASE("the data-parallel size excludes tensor parallelism", "[config][auto]") {
  // 8 ranks, autotp_size 2: dp = 4; micro 2 x accumulation 1 x 4 = 8.
  auto r = batch_of(resolve_auto(load_json(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 2}})"), world(8)));
  CHECK(r.train == 8);
}

TEST_CASE("hidden-size rules, including truncation of 0.9 h^2", "[config][auto]") {
  const Config c = load_json(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto"}})");
  Facts f = world(1);
  f.hidden_size = 4097;  // 4097^2 = 16785409; 0.9 x that = 15106868.1 -> 15106868
  const Config r = resolve_auto(c, f);
  CHECK(r.zero_optimization.reduce_bucket_size.value == 16'785'409);
  CHECK(r.zero_optimization.stage3_prefetch_bucket_size.value == 15'106'868);
  CHECK(r.zero_optimization.stage3_param_persistence_threshold.value == 40'970);
  CHECK(r.provenance.get("zero_optimization.stage3_prefetch_bucket_size").note == "int(0.9 x 4097 x 4097)");
}

TEST_CASE("resolve_known leaves what it cannot resolve, marked with the fact", "[config][auto]") {
  const Config c = load_json(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "optimizer": {"type": "Adam", "params": {"lr": "auto"}}})");
  Facts f;
  f.hidden_size = 1024;
  const Config r = resolve_known(c, f);
  CHECK(r.zero_optimization.reduce_bucket_size.value == 1'048'576);
  CHECK(r.optimizer->lr.is_auto);
  const auto pending = pending_auto(r);
  const auto has = [&](const std::string& path, const std::string& fact) {
    for (const auto& [p, f2] : pending) {
      if (p == path && f2.find(fact) != std::string::npos) return true;
    }
    return false;
  };
  CHECK(has("optimizer.params.lr", "--lr"));
  CHECK(has("train_micro_batch_size_per_gpu", "--micro-batch"));
  CHECK(has("train_batch_size", "--world-size"));
  CHECK(has("train_micro_batch_size_per_gpu", "--micro-batch"));
  // resolve_auto names every one of them in one error.
  const std::string e = config_error([&] { resolve_auto(c, f); });
  CHECK_THAT(e, Catch::Contains("optimizer.params.lr: \"auto\" cannot be resolved: it needs the learning rate (--lr)"));
  CHECK_THAT(e, Catch::Contains("train_micro_batch_size_per_gpu: \"auto\" cannot be resolved: it needs the per-device batch size"));
}

TEST_CASE("values the file leaves out wait for facts too, and say so", "[config][auto]") {
  const Config c = tessera::config::test::load_toml("train_batch_size = 64\n[zero_optimization]\nstage = 1\n", "batch.toml");
  const std::string e = config_error([&] { resolve_auto(c, Facts{}); });
  CHECK_THAT(e, Catch::Contains("batch.toml: train_micro_batch_size_per_gpu: cannot be derived: it needs the world size (--world-size)"));
  const Config none = tessera::config::test::load_toml("[zero_optimization]\nstage = 1\n", "none.toml");
  const std::string e2 = config_error([&] { resolve_auto(none, world(4)); });
  CHECK_THAT(e2, Catch::Contains("none.toml: train_micro_batch_size_per_gpu: cannot be derived: it needs the per-device batch size (--micro-batch)"));
  const Config autos = tessera::config::test::load_toml("train_batch_size = \"auto\"\n", "auto.toml");
  const std::string e3 = config_error([&] { resolve_auto(autos, Facts{}); });
  CHECK_THAT(e3, Catch::Contains("auto.toml:1: train_batch_size: \"auto\" cannot be resolved: it needs the world size (--world-size)"));
}

TEST_CASE("resolving is idempotent and leaves the input as it was", "[config][auto]") {
  const Config c = load_json(R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2})");
  Facts f = world(2);
  f.micro_batch_size = 3;
  const Config r = resolve_auto(c, f);
  CHECK(c.train_micro_batch_size_per_gpu.is_auto);
  CHECK(resolve_auto(r, f) == r);
}

TEST_CASE("a stage that arrives as a fact brings its dependent defaults", "[config][auto]") {
  const Config c = load_json(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": "auto"}})");
  CHECK_FALSE(c.zero_optimization.overlap_comm);
  Facts f = world(2);
  f.zero_stage = 3;
  CHECK(resolve_auto(c, f).zero_optimization.overlap_comm);  // DeepSpeed turns it on with stage 3
}

TEST_CASE("resolve_for_engine resolves, then refuses what tessera lacks", "[config][auto]") {
  Facts f = world(2);
  f.micro_batch_size = 1;
  const Config ok = resolve_for_engine(load_json(R"({"train_micro_batch_size_per_gpu": "auto", "flops_profiler": {}})"), f);
  CHECK(ok.train_batch_size.value == 2);
  const Config lacking = load_json(R"({"train_micro_batch_size_per_gpu": 1, "communication_data_type": "bf16"})");
  CHECK(lacking.unsupported.size() == 1);  // loading accepts it
  const std::string e = config_error([&] { resolve_for_engine(lacking, f); });
  CHECK_THAT(e, Catch::Contains("communication_data_type = \"bf16\": not yet supported"));
}
