// The numeric ranges DeepSpeed accepts (deepspeed/runtime/zero/config.py, zero/offload_config.py,
// runtime/precision_config.py, runtime/tensor_parallel/config.py): every value DeepSpeed takes
// loads here too, keeping DeepSpeed's meaning; the first value outside is refused by name
// (bad_inputs_test.cpp holds those refusals).
#include <catch2/catch.hpp>

#include "core/config/resolve_auto.h"
#include "core/config/validate.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::config_error;
using tessera::config::test::load_json;
using tessera::config::test::source_path;

namespace {

struct Accepted {
  const char* name;
  const char* json;
};

// Each is a lowest value DeepSpeed takes (ge=0 sizes at 0) or a value with a documented meaning.
const Accepted kAccepted[] = {
    {"reduce_bucket_size 0 (one bucket per parameter)", R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0}})"},
    {"allgather_bucket_size 0", R"({"zero_optimization": {"stage": 1, "allgather_bucket_size": 0}})"},
    {"sub_group_size 0", R"({"zero_optimization": {"stage": 3, "sub_group_size": 0}})"},
    {"stage3 sizes 0", R"({"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 0,
       "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 0, "stage3_max_reuse_distance": 0}})"},
    {"zero_hpz_partition_size 0 (no secondary partition)", R"({"zero_optimization": {"stage": 3, "zero_hpz_partition_size": 0}})"},
    {"offload buffers 0", R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"buffer_count": 0},
       "offload_param": {"buffer_count": 0, "buffer_size": 0, "max_in_cpu": 0}}})"},
    {"autotp_size 0 (DeepSpeed's default: disabled)", R"({"tensor_parallel": {"autotp_size": 0}})"},
    {"gradient_clipping 0", R"({"gradient_clipping": 0})"},
    {"negative gradient_clipping (no clipping)", R"({"gradient_clipping": -1.0})"},
    {"hysteresis 0", R"({"fp16": {"enabled": true, "hysteresis": 0}})"},
    {"negative hysteresis", R"({"fp16": {"enabled": true, "hysteresis": -3}})"},
    {"negative initial_scale_power (a scale below 1)", R"({"fp16": {"enabled": true, "initial_scale_power": -2}})"},
    {"initial_scale_power 63", R"({"fp16": {"enabled": true, "initial_scale_power": 63}})"},
    {"loss_scale_window 0 without fp16", R"({"fp16": {"enabled": false, "loss_scale_window": 0}})"},
    {"loss_scale_window 0 with a static scale", R"({"fp16": {"enabled": true, "loss_scale": 128, "loss_scale_window": 0}})"},
    {"min_loss_scale 0 without fp16", R"({"fp16": {"min_loss_scale": 0}})"},
};

}  // namespace

TEST_CASE("values DeepSpeed accepts load and validate", "[config][ranges]") {
  for (const Accepted& a : kAccepted) {
    DYNAMIC_SECTION(a.name) {
      Config c;
      CHECK_NOTHROW(c = load_json(a.json));
      CHECK_NOTHROW(validate(c));
    }
  }
}

TEST_CASE("zero sizes keep their value", "[config][ranges]") {
  const Config c = load_json(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 0, "allgather_bucket_size": 0,
                                 "zero_hpz_partition_size": 0}})");
  CHECK(c.zero_optimization.reduce_bucket_size == Auto<std::int64_t>(0));
  CHECK(c.zero_optimization.allgather_bucket_size == 0);
  CHECK(c.zero_optimization.zero_hpz_partition_size == 0);
  CHECK(c.unsupported.empty());  // hpZ starts at 2: 0 asks for nothing
}

TEST_CASE("autotp_size 0 is no tensor parallelism when the batch is derived", "[config][ranges]") {
  Facts facts;
  facts.world_size = 8;
  const Config r = resolve_auto(load_json(R"({"train_micro_batch_size_per_gpu": 2, "tensor_parallel": {"autotp_size": 0}})"), facts);
  CHECK(r.train_batch_size == Auto<std::int64_t>(16));  // 2 x 1 x dp 8
}

TEST_CASE("dynamic loss scaling's window and floor are checked once fp16 \"auto\" is resolved", "[config][ranges]") {
  const char* json = R"({"fp16": {"enabled": "auto", "loss_scale_window": 0}})";
  const Config c = load_json(json);  // fp16 may stay off: not an error yet
  Facts bf16;
  bf16.mixed_precision = "bf16";
  CHECK_NOTHROW(resolve_known(c, bf16));
  Facts fp16;
  fp16.mixed_precision = "fp16";
  CHECK_THAT(config_error([&] { resolve_known(c, fp16); }),
             Catch::Contains("fp16.loss_scale_window: expected an integer >= 1, got 0"));
}

TEST_CASE("Transformers' tests/deepspeed/ds_config_zero3.json with zero bucket sizes loads", "[config][ranges]") {
  const Config c = load_config(source_path("configs/deepspeed/hf_tests_ds_config_zero3_zero_buckets.json"));
  const ZeroConfig& z = c.zero_optimization;
  CHECK(z.stage == Auto<std::int64_t>(3));
  CHECK(z.reduce_bucket_size == Auto<std::int64_t>(0));
  CHECK(z.stage3_prefetch_bucket_size == Auto<std::int64_t>(0));
  CHECK(z.stage3_param_persistence_threshold == Auto<std::int64_t>(0));
  CHECK(z.sub_group_size == 100'000'000'000'000);  // 1e14
  CHECK(z.stage3_gather_16bit_weights_on_model_save == Auto<bool>(true));  // the fp16 alias
  CHECK(c.fp16.enabled == Auto<bool>(true));
  CHECK(c.optimizer->betas == Auto<std::array<double, 2>>(std::array<double, 2>{0.8, 0.999}));
}
