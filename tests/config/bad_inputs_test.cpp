// Bad inputs: each must fail with an error that names the key path and says what is wrong, the
// value and what was expected, and the file (with the line for TOML).
#include <catch2/catch.hpp>

#include "core/config/resolve_auto.h"
#include "core/config/validate.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::config_error;

namespace {

enum class Stage { load, resolve, refuse };

struct BadInput {
  const char* name;
  Format format;
  const char* text;
  const char* key_path;  // must appear in the message ("" for whole-file syntax errors)
  const char* message;   // must appear in the message
  Stage stage = Stage::load;
  std::int64_t world_size = 8;  // facts for Stage::resolve
};

constexpr Format J = Format::json;
constexpr Format T = Format::toml;

const BadInput kBadInputs[] = {
    // syntax
    {"JSON syntax error", J, R"({"train_batch_size": 8,})", "", "JSON syntax error"},
    {"TOML syntax error", T, "[zero_optimization]\nstage = \n", "", "bad.toml:2: TOML syntax error"},
    {"duplicate JSON key", J, R"({"zero_optimization": {"stage": 1, "stage": 2}})", "stage", "appears twice"},
    {"root is a list", J, R"([1, 2])", "(top level)", "expected a table of settings"},
    {"TOML date", T, "train_batch_size = 2024-01-01\n", "", "dates and times are not configuration values"},
    // wrong types
    {"string batch size", J, R"({"train_batch_size": "eight"})", "train_batch_size", "expected an integer, got \"eight\""},
    {"fractional batch size", J, R"({"train_micro_batch_size_per_gpu": 2.5})", "train_micro_batch_size_per_gpu",
     "expected an integer, got 2.5"},
    {"string boolean", J, R"({"wall_clock_breakdown": "yes"})", "wall_clock_breakdown", "expected true or false, got \"yes\""},
    {"section not a table", J, R"({"fp16": true})", "fp16", "expected a table, got a boolean true"},
    {"auto where not accepted", J, R"({"steps_per_print": "auto"})", "steps_per_print", "\"auto\" is not accepted for this key"},
    {"betas of three", J, R"({"optimizer": {"type": "Adam", "params": {"betas": [0.9, 0.99, 0.999]}}})",
     "optimizer.params.betas", "expected a list of two numbers"},
    {"lower_precision_safe_modules not strings", J, R"({"torch_autocast": {"lower_precision_safe_modules": [1]}})",
     "torch_autocast.lower_precision_safe_modules[0]", "expected a string, got 1"},
    {"shape with names", J, R"({"tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
       "shape": [["q_size", "kv_size", "kv_size"], -1]}]}}})",
     "tensor_parallel.partition_config.layer_specs[0].shape[0][0]", "expected an integer, got \"q_size\""},
    // enums
    {"offload device gpu", J, R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "gpu"}}})",
     "zero_optimization.offload_optimizer.device", "expected one of none, cpu, nvme, got \"gpu\" (a string)"},
    {"optimizer type typo", J, R"({"optimizer": {"type": "AdamX"}})", "optimizer.type", "did you mean \"Adam\"?"},
    {"optimizer without type", J, R"({"optimizer": {"params": {"lr": 0.1}}})", "optimizer.type", "required, missing"},
    {"scheduler type typo", J, R"({"scheduler": {"type": "WarmupDecay"}})", "scheduler.type", "did you mean \"WarmupDecayLR\"?"},
    {"partition type", J, R"({"tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
       "partition_type": "diagonal"}]}}})",
     "layer_specs[0].partition_type", "expected one of row, column, skip"},
    {"transport backend", T, "[tessera.transport]\nbackend = \"mpi\"\n", "tessera.transport.backend",
     "expected one of auto, ucx, gloo, nccl, got \"mpi\""},
    {"replica policy", T, "[tessera.rollout]\nreplica_policy = \"random\"\n", "bad.toml:2: tessera.rollout.replica_policy",
     "expected one of lowest, local, balanced"},
    {"UCX transport typo", T, "[tessera.transport]\nucx_transports = [\"rc\", \"shmm\"]\n",
     "tessera.transport.ucx_transports[1]", "unknown UCX transport \"shmm\"; did you mean \"shm\"?"},
    {"preset model typo", J, R"({"tensor_parallel": {"preset_model": "lama"}})", "tensor_parallel.preset_model",
     "did you mean \"llama\"?"},
    // out of range
    {"stage 4", J, R"({"zero_optimization": {"stage": 4}})", "zero_optimization.stage", "expected 0, 1, 2 or 3, got 4"},
    {"stage 5 in TOML, with its line", T, "# ZeRO\n[zero_optimization]\nstage = 5\n", "bad.toml:3: zero_optimization.stage",
     "expected 0, 1, 2 or 3, got 5"},
    {"batch size 0", J, R"({"train_batch_size": 0})", "train_batch_size", "expected a positive integer, got 0"},
    // fp16 as DeepSpeed's DeepSpeedFP16Config (ranges_test.cpp: the values just inside)
    {"initial scale power 64", J, R"({"fp16": {"enabled": true, "initial_scale_power": 64}})", "fp16.initial_scale_power",
     "expected an integer in [-1074, 63]"},
    {"initial scale power -1075", J, R"({"fp16": {"initial_scale_power": -1075}})", "fp16.initial_scale_power",
     "got -1075"},
    {"negative loss scale", J, R"({"fp16": {"loss_scale": -1}})", "fp16.loss_scale", "expected a finite number >= 0"},
    {"infinite loss scale", T, "[fp16]\nloss_scale = inf\n", "fp16.loss_scale", "expected a finite number >= 0 (0 = dynamic loss scaling), got inf"},
    {"min loss scale 0, dynamic", J, R"({"fp16": {"enabled": true, "min_loss_scale": 0}})", "fp16.min_loss_scale",
     "expected a number > 0, got 0"},
    {"loss scale window 0, dynamic", J, R"({"fp16": {"enabled": true, "loss_scale_window": 0}})", "fp16.loss_scale_window",
     "expected an integer >= 1, got 0"},
    {"negative lr", J, R"({"optimizer": {"type": "AdamW", "params": {"lr": -0.1}}})", "optimizer.params.lr",
     "expected a number >= 0, got -0.1"},
    {"beta 1.5", J, R"({"optimizer": {"type": "Lion", "params": {"betas": [1.5, 0.99]}}})", "optimizer.params.betas",
     "expected each beta in [0, 1), got beta1 = 1.5"},
    {"negative bucket size", J, R"({"zero_optimization": {"reduce_bucket_size": -1}})", "zero_optimization.reduce_bucket_size",
     "expected an integer >= 0, got -1"},
    {"negative allgather bucket size", J, R"({"zero_optimization": {"allgather_bucket_size": -1}})",
     "zero_optimization.allgather_bucket_size", "expected an integer >= 0, got -1"},
    {"negative hpz partition size", J, R"({"zero_optimization": {"zero_hpz_partition_size": -1}})",
     "zero_optimization.zero_hpz_partition_size", "expected an integer >= 0, got -1"},
    {"negative offload buffer count", J, R"({"zero_optimization": {"offload_param": {"buffer_count": -1}}})",
     "zero_optimization.offload_param.buffer_count", "expected an integer >= 0, got -1"},
    {"negative autotp size", J, R"({"tensor_parallel": {"autotp_size": -1}})", "tensor_parallel.autotp_size",
     "expected an integer >= 0, got -1"},
    {"staging budget 0", T, "[tessera.rollout]\nstaging_budget_bytes = 0\n", "tessera.rollout.staging_budget_bytes",
     "expected an integer >= 1, got 0"},
    {"timeout 0", T, "[tessera.transport]\ncollective_timeout_ms = 0\n", "tessera.transport.collective_timeout_ms", ">= 1"},
    {"partition_dim out of range", J, R"({"tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
       "shape": [2, -1], "partition_dim": 2}]}}})",
     "layer_specs[0].partition_dim", "expected a dimension of shape (0..1), got 2"},
    {"two rest sizes", J, R"({"tensor_parallel": {"partition_config": {"layer_specs": [{"patterns": ["x"],
       "shape": [-1, -1]}]}}})",
     "layer_specs[0].shape", "at most one size may be -1"},
    {"layer spec without patterns", J, R"({"tensor_parallel": {"partition_config": {"layer_specs": [{"partition_type": "row"}]}}})",
     "layer_specs[0].patterns", "required, missing"},
    // unknown keys
    {"top-level typo", J, R"({"train_batch_sise": 8})", "train_batch_sise", "unknown key \"train_batch_sise\"; did you mean \"train_batch_size\"?"},
    {"zero typo", J, R"({"zero_optimization": {"stage3_prefetch_bucket_sise": 1}})",
     "zero_optimization.stage3_prefetch_bucket_sise", "did you mean \"stage3_prefetch_bucket_size\"?"},
    {"offload typo", J, R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memroy": true}}})",
     "zero_optimization.offload_param.pin_memroy", "did you mean \"pin_memory\"?"},
    {"typo of an ignored key", J, R"({"zero_optimization": {"round_robin_gradient": true}})",
     "zero_optimization.round_robin_gradient", "did you mean \"round_robin_gradients\"?"},
    {"TOML typo with line", T, "[fp16]\nenabled = true\nloss_scale_windw = 100\n", "bad.toml:3: fp16.loss_scale_windw",
     "did you mean \"loss_scale_window\"?"},
    {"nonsense key", J, R"({"banana": 1})", "banana", "neither a DeepSpeed nor a tessera key"},
    {"optimizer param typo", J, R"({"optimizer": {"type": "AdamW", "params": {"weight_decya": 0.1}}})",
     "optimizer.params.weight_decya", "did you mean \"weight_decay\"?"},
    {"parameter of another optimizer", J, R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "betas": [0.9, 0.99]}}})",
     "optimizer.params.betas", "not a parameter of optimizer type SGD (it takes: lr, weight_decay, momentum"},
    {"parameter of another scheduler", J, R"({"scheduler": {"type": "WarmupLR", "params": {"cycle_min_lr": 0.1}}})",
     "scheduler.params.cycle_min_lr", "not a parameter of scheduler type WarmupLR"},
    {"alias and target together", J, R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true,
       "stage3_gather_16bit_weights_on_model_save": true}})",
     "zero_optimization.stage3_gather_fp16_weights_on_model_save", "they are one setting (alias), keep one"},
    // rules between keys
    {"offload_param with stage 2", J, R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})",
     "zero_optimization.offload_param.device", "\"cpu\" needs ZeRO stage 3 (parameters are partitioned only in stage 3), but zero_optimization.stage is 2"},
    {"offload_optimizer with stage 0", J, R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}}})",
     "zero_optimization.offload_optimizer.device", "needs ZeRO stage 1, 2 or 3"},
    {"nvme without path", J, R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})",
     "zero_optimization.offload_param.nvme_path", "required when offload_param.device is \"nvme\", missing"},
    {"fp16 and bf16", J, R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})", "bf16.enabled",
     "fp16.enabled and bf16.enabled are both true"},
    {"autocast with bf16", J, R"({"bf16": {"enabled": true}, "torch_autocast": {"enabled": true}})", "torch_autocast.enabled",
     "cannot be combined with bf16.enabled"},
    {"autocast dtype", J, R"({"torch_autocast": {"dtype": "int8"}})", "torch_autocast.dtype", "expected bfloat16 or float16"},
    {"grad_accum_dtype", J, R"({"data_types": {"grad_accum_dtype": "int8"}})", "data_types.grad_accum_dtype", "expected fp32, fp16 or bf16"},
    {"ZeRO++ with stage 2", J, R"({"zero_optimization": {"stage": 2, "zero_quantized_weights": true}})",
     "zero_optimization.zero_quantized_weights", "ZeRO++ extends ZeRO stage 3, but zero_optimization.stage is 2"},
    {"AutoTP with stage 3", J, R"({"zero_optimization": {"stage": 3}, "tensor_parallel": {"autotp_size": 4}})",
     "tensor_parallel.autotp_size", "AutoTP training supports ZeRO stages 0, 1 and 2"},
    {"AutoSP with stage 1", J, R"({"zero_optimization": {"stage": 1}, "compile": {"deepcompile": true, "passes": ["autosp"]}})",
     "compile.passes", "\"autosp\" needs ZeRO stage 0"},
    {"WarmupDecayLR without total", J, R"({"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}})",
     "scheduler.params.total_num_steps", "required by WarmupDecayLR, missing"},
    {"total below warmup", J, R"({"scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 100, "total_num_steps": 50}}})",
     "scheduler.params.total_num_steps", "expected at least warmup_num_steps (100), got 50"},
    {"warmup type", J, R"({"scheduler": {"type": "WarmupLR", "params": {"warmup_type": "cosine"}}})",
     "scheduler.params.warmup_type", "expected \"log\" or \"linear\", got \"cosine\""},
    {"OneCycle without max", J, R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.1}}})",
     "scheduler.params.cycle_max_lr", "required by OneCycle, missing"},
    {"nesterov without momentum", J, R"({"optimizer": {"type": "SGD", "params": {"nesterov": true}}})",
     "optimizer.params.nesterov", "needs momentum > 0 and dampening 0"},
    {"AdamW with adam_w_mode false", J, R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})",
     "optimizer.params.adam_w_mode", "contradicts type AdamW"},
    // resolving
    {"inconsistent batch sizes", J, R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4})",
     "train_batch_size",
     "32 does not equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x data-parallel size = 4 x 4 x 8 = 128",
     Stage::resolve},
    {"batch not divisible", J, R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})", "gradient_accumulation_steps",
     "train_batch_size 30 is not divisible by micro batch x data-parallel size 2 = 8", Stage::resolve, 2},
    {"auto without hidden size", J, R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"reduce_bucket_size": "auto"}})",
     "zero_optimization.reduce_bucket_size", "\"auto\" cannot be resolved: it needs the model's hidden size (--hidden-size)",
     Stage::resolve},
    {"auto lr", J, R"({"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adam", "params": {"lr": "auto"}}})",
     "optimizer.params.lr", "it needs the learning rate (--lr)", Stage::resolve},
    {"auto micro batch", J, R"({"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 1})",
     "train_micro_batch_size_per_gpu", "it needs the per-device batch size (--micro-batch)", Stage::resolve},
    {"world size vs autotp", J, R"({"train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 3}})",
     "tensor_parallel.autotp_size", "the world size 8 is not a multiple of autotp_size 3", Stage::resolve},
    {"auto offload device without a fact", J, R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 1,
       "offload_param": {"device": "auto"}}})",
     "zero_optimization.offload_param.device", "it needs the parameter offload device", Stage::resolve},
    // not yet supported: loads, refused when an engine starts
    {"communication_data_type", J, R"({"communication_data_type": "fp16"})", "communication_data_type = \"fp16\"",
     "not yet supported (reducing gradients in another dtype)", Stage::refuse},
    {"1-bit Adam", J, R"({"optimizer": {"type": "OneBitAdam", "params": {"lr": 0.001, "freeze_step": 400}}})",
     "optimizer.type = \"OneBitAdam\"", "not yet supported", Stage::refuse},
    {"sparse attention", J, R"({"sparse_attention": {"mode": "fixed", "block": 16}})", "sparse_attention", "sparse attention kernels",
     Stage::refuse},
    {"curriculum learning on", J, R"({"curriculum_learning": {"enabled": true}})", "curriculum_learning", "not yet supported",
     Stage::refuse},
    {"MiCS", J, R"({"zero_optimization": {"stage": 3, "mics_shard_size": 8}})", "zero_optimization.mics_shard_size = 8",
     "MiCS sharding", Stage::refuse},
};

}  // namespace

TEST_CASE("bad inputs fail with the key path and the message", "[config][errors]") {
  int count = 0;
  for (const BadInput& bad : kBadInputs) {
    DYNAMIC_SECTION(bad.name) {
      const std::string origin = bad.format == J ? "bad.json" : "bad.toml";
      const std::string message = config_error([&] {
        Config c = load_config_text(bad.text, bad.format, origin);
        if (bad.stage == Stage::resolve) {
          Facts facts;
          facts.world_size = bad.world_size;
          resolve_auto(c, facts);
        } else if (bad.stage == Stage::refuse) {
          refuse_unsupported(c);
        }
      });
      INFO(message);
      CHECK_THAT(message, Catch::Contains(origin));
      CHECK_THAT(message, Catch::Contains(bad.key_path));
      CHECK_THAT(message, Catch::Contains(bad.message));
    }
    ++count;
  }
  CHECK(count >= 40);
}

TEST_CASE("several errors in one file are reported together", "[config][errors]") {
  const std::string message = config_error([] {
    load_config_text(R"({"train_batch_sise": 8, "zero_optimization": {"stage": "two"}, "fp16": {"enabled": 1}})", Format::json,
                     "many.json");
  });
  CHECK_THAT(message, Catch::StartsWith("3 configuration errors:"));
  CHECK_THAT(message, Catch::Contains("many.json:1: train_batch_sise: unknown key"));
  CHECK_THAT(message, Catch::Contains("many.json:1: zero_optimization.stage: expected an integer, got \"two\""));
  CHECK_THAT(message, Catch::Contains("many.json:1: fp16.enabled: expected true or false, got 1"));
}

TEST_CASE("JSON errors carry the line of the key", "[config][errors]") {
  const std::string message = config_error([] {
    load_config_text("{\n  \"zero_optimization\": {\n    \"stage\": 2,\n    \"offload_param\": {\"device\": \"cpu\"},\n"
                     "    \"sub_group_size\": \"big\"\n  },\n  \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"betas\": [0.9,\n 2]}}\n}\n",
                     Format::json, "lines.json");
  });
  CHECK_THAT(message, Catch::Contains("lines.json:5: zero_optimization.sub_group_size: expected an integer"));
  const std::string rule = config_error([] {
    load_config_text("{\"zero_optimization\": {\n\"stage\": 2,\n\"offload_param\": {\n\"device\": \"cpu\"}}}", Format::json,
                     "rule.json");
  });
  CHECK_THAT(rule, Catch::Contains("rule.json:4: zero_optimization.offload_param.device: \"cpu\" needs ZeRO stage 3"));
}

TEST_CASE("a missing file names itself", "[config][errors]") {
  const std::string message = config_error([] { load_config("/nonexistent/ds_config.json"); });
  CHECK_THAT(message, Catch::Contains("/nonexistent/ds_config.json: cannot read"));
}
