// Loading real files: the Accelerate templates and ds_config.json examples of the reference text
// (reference/002), DeepSpeed configs as popular projects ship them, and every preset in configs/.
#include <catch2/catch.hpp>

#include <algorithm>
#include <dirent.h>

#include "core/config/load.h"
#include "core/config/resolve_auto.h"
#include "core/config/validate.h"
#include "core/config/write.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::config_error;
using tessera::config::test::load_json;
using tessera::config::test::load_toml;
using tessera::config::test::source_path;

namespace {
std::vector<std::string> files_in(const std::string& dir, const std::string& extension) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.size() > extension.size() && name.compare(name.size() - extension.size(), extension.size(), extension) == 0) {
        out.push_back(dir + "/" + name);
      }
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool has_warning(const Config& c, const std::string& text) {
  return std::any_of(c.warnings.begin(), c.warnings.end(), [&](const std::string& w) { return w.find(text) != std::string::npos; });
}
}  // namespace

TEST_CASE("Accelerate's zero_stage2_config.json loads unchanged, with its auto values pending", "[config][load]") {
  const Config c = load_config(source_path("configs/deepspeed/accelerate_zero_stage2_config.json"));
  CHECK(c.fp16.enabled == Auto<bool>(true));
  CHECK(c.fp16.loss_scale == 0.0);
  CHECK(c.fp16.initial_scale_power == 16);
  REQUIRE(c.optimizer);
  CHECK(c.optimizer->type == OptimizerType::adamw);
  CHECK(c.optimizer->lr.is_auto);
  CHECK(c.optimizer->torch_adam);
  REQUIRE(c.scheduler);
  CHECK(c.scheduler->type == SchedulerType::warmup_decay_lr);
  CHECK(c.zero_optimization.stage == Auto<std::int64_t>(2));
  CHECK(c.zero_optimization.allgather_bucket_size == 200'000'000);  // 2e8 written as a float
  CHECK(c.zero_optimization.reduce_bucket_size.is_auto);
  CHECK(c.gradient_accumulation_steps == Auto<std::int64_t>(1));
  CHECK(c.steps_per_print == 2000);
  CHECK(c.warnings.empty());
  CHECK(c.unsupported.empty());
  CHECK(c.provenance.get("zero_optimization.reduce_bucket_size").origin == Origin::pending_auto);
  CHECK(c.provenance.get("zero_optimization.sub_group_size").origin == Origin::default_value);
  CHECK(c.provenance.get("zero_optimization.overlap_comm").origin == Origin::given);
}

TEST_CASE("zero_stage2_config.json resolves as Accelerate does for gpt2-large", "[config][load][auto]") {
  // The text's run: gpt2-large (hidden size 1280), --per_device_train_batch_size 24,
  // --learning_rate 5e-4, 2 processes. DummyOptim's weight decay defaults to 0.
  const Config c = load_config(source_path("configs/deepspeed/accelerate_zero_stage2_config.json"));
  Facts f;
  f.world_size = 2, f.hidden_size = 1280, f.micro_batch_size = 24, f.lr = 5e-4, f.weight_decay = 0.0;
  f.gradient_clipping = 1.0, f.warmup_steps = 0, f.total_steps = 1000;
  const Config r = resolve_auto(c, f);
  CHECK(r.train_micro_batch_size_per_gpu == Auto<std::int64_t>(24));
  CHECK(r.train_batch_size == Auto<std::int64_t>(48));  // 24 x 1 x 2
  CHECK(r.zero_optimization.reduce_bucket_size == Auto<std::int64_t>(1'638'400));  // 1280^2
  CHECK(r.optimizer->lr == Auto<double>(5e-4));
  CHECK(r.scheduler->warmup_max_lr == Auto<double>(5e-4));
  CHECK(r.scheduler->warmup_min_lr == Auto<double>(0.0));
  CHECK(r.scheduler->total_num_steps == Auto<std::int64_t>(1000));
  CHECK(r.gradient_clipping == Auto<double>(1.0));
  CHECK(pending_auto(r).empty());
  CHECK(r.provenance.get("train_batch_size").origin == Origin::derived);
  CHECK(r.provenance.get("train_batch_size").note.find("24 x 1 x 2") != std::string::npos);
}

TEST_CASE("zero_stage3_offload_config.json resolves the three hidden-size rules", "[config][load][auto]") {
  const Config c = load_config(source_path("configs/deepspeed/accelerate_zero_stage3_offload_config.json"));
  CHECK(c.zero_optimization.offload_optimizer.device == Auto<OffloadDevice>(OffloadDevice::cpu));
  CHECK(c.zero_optimization.offload_param.device == Auto<OffloadDevice>(OffloadDevice::cpu));
  CHECK(c.zero_optimization.offload_param.pin_memory);
  CHECK(c.zero_optimization.stage3_max_live_parameters == 1'000'000'000);
  CHECK(c.zero_optimization.stage3_gather_16bit_weights_on_model_save.is_auto);
  Facts f;
  f.world_size = 2, f.hidden_size = 1280, f.micro_batch_size = 32, f.lr = 5e-4, f.weight_decay = 0.0;
  f.gradient_clipping = 1.0, f.warmup_steps = 0, f.total_steps = 1000, f.save_16bit_model = true;
  const Config r = resolve_auto(c, f);
  CHECK(r.train_batch_size == Auto<std::int64_t>(64));  // 32 x 1 x 2
  CHECK(r.zero_optimization.reduce_bucket_size == Auto<std::int64_t>(1'638'400));           // h*h
  CHECK(r.zero_optimization.stage3_prefetch_bucket_size == Auto<std::int64_t>(1'474'560));  // int(0.9*h*h)
  CHECK(r.zero_optimization.stage3_param_persistence_threshold == Auto<std::int64_t>(12'800));  // 10*h
  CHECK(r.zero_optimization.stage3_gather_16bit_weights_on_model_save == Auto<bool>(true));
}

TEST_CASE("ds_config.json of scenario 1 (bf16, ZeRO-3, accumulation 10) loads and resolves", "[config][load][auto]") {
  const Config c = load_config(source_path("configs/deepspeed/accelerate_ds_config_bf16_zero3.json"));
  CHECK(c.bf16.enabled == Auto<bool>(true));
  CHECK(c.zero_optimization.stage == Auto<std::int64_t>(3));
  CHECK(c.zero_optimization.stage3_gather_16bit_weights_on_model_save == Auto<bool>(false));
  CHECK(c.zero_optimization.offload_optimizer.device == Auto<OffloadDevice>(OffloadDevice::none));
  CHECK(c.gradient_clipping == Auto<double>(1.0));
  CHECK(c.gradient_accumulation_steps == Auto<std::int64_t>(10));
  CHECK(c.steps_per_print == 2'000'000);
  // Scenario 2 runs it on 4 processes; with a per-device batch of 8: 8 x 10 x 4 = 320.
  Facts f;
  f.world_size = 4, f.micro_batch_size = 8;
  const Config r = resolve_auto(c, f);
  CHECK(r.train_batch_size == Auto<std::int64_t>(320));
  CHECK(r.fp16.enabled == Auto<bool>(false));  // the printed ds_config adds fp16 disabled
}

TEST_CASE("ds_config.json of scenario 3 (all auto) takes the launch arguments", "[config][load][auto]") {
  // accelerate launch --mixed_precision=fp16 --zero_stage=3 --gradient_accumulation_steps=5
  //   --gradient_clipping=1.0 --offload_param_device=cpu --offload_optimizer_device=nvme
  //   --zero3_save_16bit_model=true   (4 processes)
  const Config c = load_config(source_path("configs/deepspeed/accelerate_ds_config_all_auto.json"));
  CHECK(c.zero_optimization.stage.is_auto);
  CHECK(c.bf16.enabled.is_auto);
  Facts f;
  f.mixed_precision = "fp16", f.zero_stage = 3, f.gradient_accumulation_steps = 5, f.gradient_clipping = 1.0;
  f.offload_param_device = OffloadDevice::cpu, f.offload_optimizer_device = OffloadDevice::nvme, f.save_16bit_model = true;
  // DeepSpeed needs a folder for NVMe offload (Accelerate's offload_optimizer_nvme_path).
  const std::string e = config_error([&] { resolve_known(c, f); });
  CHECK_THAT(e, Catch::Contains("zero_optimization.offload_optimizer.nvme_path: required when offload_optimizer.device is \"nvme\""));
  f.offload_optimizer_nvme_path = "/local_nvme";
  // Without the world size and batch size the batch values stay auto, as in the printed ds_config.
  const Config r = resolve_known(c, f);
  CHECK(r.bf16.enabled == Auto<bool>(false));
  CHECK(r.fp16.enabled == Auto<bool>(true));  // the file has no fp16 section: the mode turns it on
  CHECK(r.fp16.auto_cast);
  CHECK(r.zero_optimization.stage == Auto<std::int64_t>(3));
  CHECK(r.zero_optimization.stage3_gather_16bit_weights_on_model_save == Auto<bool>(true));
  CHECK(r.zero_optimization.offload_optimizer.device == Auto<OffloadDevice>(OffloadDevice::nvme));
  CHECK(r.zero_optimization.offload_param.device == Auto<OffloadDevice>(OffloadDevice::cpu));
  CHECK(r.gradient_clipping == Auto<double>(1.0));
  CHECK(r.gradient_accumulation_steps == Auto<std::int64_t>(5));
  CHECK(r.train_batch_size.is_auto);
  CHECK(r.train_micro_batch_size_per_gpu.is_auto);
  CHECK(r.zero_optimization.offload_optimizer.nvme_path == "/local_nvme");
  f.world_size = 4, f.micro_batch_size = 2;
  CHECK(resolve_auto(c, f).train_batch_size == Auto<std::int64_t>(40));  // 2 x 5 x 4
}

TEST_CASE("the ZeRO++ example loads; its quantization is listed as not yet supported", "[config][load]") {
  const Config c = load_config(source_path("configs/deepspeed/zeropp.json"));
  CHECK(c.zero_optimization.zero_quantized_weights);
  CHECK(c.zero_optimization.zero_hpz_partition_size == 8);
  CHECK(c.unsupported.size() == 3);
  const std::string e = config_error([&] { refuse_unsupported(c); });
  CHECK_THAT(e, Catch::Contains("zero_optimization.zero_quantized_weights = true: not yet supported"));
  CHECK_THAT(e, Catch::Contains("zero_optimization.zero_hpz_partition_size = 8"));
}

TEST_CASE("DeepSpeed configs from popular projects load unchanged", "[config][load]") {
  SECTION("HF Transformers ds_config_zero3.json") {
    const Config c = load_config(source_path("configs/deepspeed/hf_ds_config_zero3.json"));
    CHECK(c.optimizer->betas.is_auto);
    CHECK(c.scheduler->type == SchedulerType::warmup_lr);
    Facts f;
    f.world_size = 8, f.hidden_size = 4096, f.micro_batch_size = 1, f.gradient_accumulation_steps = 4, f.lr = 1e-5;
    f.weight_decay = 0.0, f.betas = std::array<double, 2>{0.9, 0.999}, f.eps = 1e-8, f.gradient_clipping = 1.0;
    f.warmup_steps = 100, f.mixed_precision = "bf16";
    const Config r = resolve_auto(c, f);
    CHECK(r.train_batch_size == Auto<std::int64_t>(32));
    CHECK(r.zero_optimization.stage3_prefetch_bucket_size == Auto<std::int64_t>(15'099'494));
    CHECK(r.bf16.enabled == Auto<bool>(true));
  }
  SECTION("DeepSpeedExamples-style BERT config: monitors and profilers are ignored with warnings") {
    const Config c = load_config(source_path("configs/deepspeed/deepspeed_examples_bert.json"));
    CHECK(has_warning(c, "flops_profiler: accepted and ignored"));
    CHECK(has_warning(c, "zero_allow_untested_optimizer: accepted and ignored"));
    CHECK(has_warning(c, "zero_optimization.round_robin_gradients: accepted and ignored"));
    CHECK(has_warning(c, "stage3_gather_fp16_weights_on_model_save: read as zero_optimization.stage3_gather_16bit_weights_on_model_save"));
    CHECK(has_warning(c, "prescale_gradients: accepted and ignored"));
    CHECK(c.unsupported.empty());
    CHECK_FALSE(c.optimizer->bias_correction);
    Facts f;
    f.world_size = 16;
    CHECK(resolve_auto(c, f).gradient_accumulation_steps == Auto<std::int64_t>(4));  // 4096 / (64 x 16)
  }
  SECTION("DeepSpeed-Chat actor config: hybrid_engine disabled asks for nothing") {
    const Config c = load_config(source_path("configs/deepspeed/deepspeed_chat_actor.json"));
    CHECK(c.unsupported.empty());
    CHECK(c.fp16.loss_scale_window == 100);
    CHECK_FALSE(c.zero_optimization.memory_efficient_linear);
    CHECK(c.zero_optimization.overlap_comm);  // DeepSpeed's default with stage 3
  }
  SECTION("OpenRLHF config: auto without a rule is DeepSpeed's default") {
    const Config c = load_config(source_path("configs/deepspeed/openrlhf_train_zero3.json"));
    CHECK(c.zero_optimization.sub_group_size == 1'000'000'000);
    CHECK(c.zero_optimization.stage3_max_live_parameters == 1'000'000'000);
    // data_types.grad_accum_dtype null asks for nothing; its optimizer offload to host memory is supported.
    CHECK(c.unsupported.empty());
    CHECK(c.zero_optimization.offload_optimizer.device == Auto<OffloadDevice>(OffloadDevice::cpu));
    Facts f;
    f.world_size = 8, f.hidden_size = 2048;
    CHECK(resolve_auto(c, f).gradient_accumulation_steps == Auto<std::int64_t>(8));  // 128 / (2 x 8)
  }
  SECTION("axolotl zero3_bf16.json: zero sizes are accepted") {
    const Config c = load_config(source_path("configs/deepspeed/axolotl_zero3_bf16.json"));
    CHECK(c.zero_optimization.sub_group_size == 0);
    CHECK(c.fp16.initial_scale_power == 32);
  }
}

TEST_CASE("every preset and example in configs/ loads", "[config][load]") {
  auto files = files_in(source_path("configs"), ".toml");
  REQUIRE(files.size() >= 6);
  for (const std::string& json : files_in(source_path("configs/deepspeed"), ".json")) files.push_back(json);
  for (const std::string& file : files) {
    INFO(file);
    CHECK_NOTHROW(load_config(file));
  }
}

TEST_CASE("the presets say what their names say", "[config][load]") {
  const Config z1 = load_config(source_path("configs/zero1.toml"));
  CHECK(z1.zero_optimization.stage == Auto<std::int64_t>(1));
  CHECK(z1.zero_optimization.reduce_bucket_size == Auto<std::int64_t>(500'000'000));
  const Config z3 = load_config(source_path("configs/zero3.toml"));
  CHECK(z3.zero_optimization.stage == Auto<std::int64_t>(3));
  CHECK(z3.zero_optimization.leaf_module.name_suffixes == std::vector<std::string>{"mlp.experts"});
  const Config cpu = load_config(source_path("configs/zero3_offload_cpu.toml"));
  CHECK(cpu.zero_optimization.offload_param.device == Auto<OffloadDevice>(OffloadDevice::cpu));
  const Config zero_offload = load_config(source_path("configs/zero2_offload_cpu.toml"));
  CHECK(zero_offload.zero_optimization.offload_optimizer.device == Auto<OffloadDevice>(OffloadDevice::cpu));
  CHECK(zero_offload.zero_optimization.offload_optimizer.buffer_count == 4);
  CHECK(zero_offload.zero_optimization.offload_param.device == Auto<OffloadDevice>(OffloadDevice::none));
  const Config partial = load_config(source_path("configs/zero3_offload_partial.toml"));
  CHECK(partial.zero_optimization.offload_optimizer.ratio == 0.5);
  CHECK(partial.unsupported.empty());
  const Config nvme = load_config(source_path("configs/zero3_offload_nvme.toml"));
  CHECK(nvme.zero_optimization.offload_optimizer.nvme_path == "/local_nvme");
  CHECK(nvme.aio.block_size == 1048576);  // the aio block is modelled (NVMe offload's I/O)
  const Config tp = load_config(source_path("configs/autotp.toml"));
  CHECK(tp.tensor_parallel.autotp_size == 4);
  REQUIRE(tp.tensor_parallel.partition_config.layer_specs.size() == 3);
  const LayerSpec& qkv = tp.tensor_parallel.partition_config.layer_specs[2];
  REQUIRE(qkv.shape.size() == 2);
  CHECK(qkv.shape[0].parts == std::vector<std::int64_t>{4096, 1024, 1024});
  CHECK(qkv.shape[1].size == -1);
  CHECK(qkv.model_types == std::vector<std::string>{"llama"});
  CHECK(tp.tessera.rollout.replica_policy == tessera::affine::ReplicaPolicyKind::balanced);
  CHECK(tp.tessera.transport.ucx_transports == std::vector<std::string>{"rc", "sm", "self"});
  // 16 ranks = 4-way TP x 4-way DP: train_batch_size = 1 x 4 x 4.
  Facts f;
  f.world_size = 16;
  CHECK(resolve_auto(tp, f).train_batch_size == Auto<std::int64_t>(16));
}

TEST_CASE("the reference text's AutoTP and leaf-module examples load", "[config][load]") {
  const Config c = load_json(R"({
    "train_micro_batch_size_per_gpu": 1,
    "zero_optimization": {"stage": 3, "leaf_module": {"classes": ["my_package.layers.CustomMoEBlock"],
      "names": ["transformer.layers.0.experts"], "name_suffixes": ["experts"]}}})");
  CHECK(c.zero_optimization.leaf_module.classes.size() == 1);
  const Config tp = load_json(R"({"tensor_parallel": {"autotp_size": 4, "partition_config": {
      "use_default_specs": false, "layer_specs": [
        {"patterns": [".*\\.o_proj\\.weight$", ".*\\.down_proj\\.weight$"], "partition_type": "row"},
        {"patterns": [".*\\.[qkv]_proj\\.weight$"], "partition_type": "column"},
        {"patterns": [".*\\.gate_up_proj\\.weight$"], "partition_type": "column", "shape": [2, -1], "partition_dim": 0},
        {"patterns": [".*\\.qkv_proj\\.weight$"], "partition_type": "column", "shape": [3, -1], "partition_dim": 0,
         "model_types": ["qwen2"]}]}},
    "zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": 1})");
  const auto& specs = tp.tensor_parallel.partition_config.layer_specs;
  REQUIRE(specs.size() == 4);
  CHECK(specs[0].partition_type == PartitionType::row);
  CHECK(specs[0].patterns[0] == ".*\\.o_proj\\.weight$");
  CHECK(specs[2].shape[0].size == 2);
  const Config sp = load_json(R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0},
      "compile": {"deepcompile": true, "passes": ["autosp"]}})");
  CHECK(sp.compile.passes == std::vector<std::string>{"autosp"});
  CHECK(sp.unsupported.size() == 1);  // DeepCompile
  const Config amp = load_json(R"({"torch_autocast": {"enabled": true, "dtype": "bfloat16",
      "lower_precision_safe_modules": ["torch.nn.Linear", "torch.nn.Conv2d"]}})");
  CHECK(amp.torch_autocast.lower_precision_safe_modules.size() == 2);
}

TEST_CASE("comment keys are skipped and TOML values carry their line", "[config][load]") {
  const Config c = load_json(R"({"_comment": "anything", "zero_optimization": {"_note": 1, "stage": 1}})");
  CHECK(c.warnings.empty());
  CHECK(c.passthrough.empty());
  const Config t = load_toml("# a comment\n\n[zero_optimization]\nstage = 2\n");
  CHECK(t.provenance.get("zero_optimization.stage").line == 4);
}

TEST_CASE("Transformers' tests/deepspeed ZeRO-3 file: the 16-bit save flag stays pending for the save call",
          "[config][load][auto]") {
  // "stage3_gather_16bit_weights_on_model_save": "auto" is decided when the model is saved; every
  // other fact given, strict resolution (what the engine calls) must not fail on it.
  const Config c = load_config(source_path("configs/deepspeed/hf_tests_ds_config_zero3.json"));
  Facts f;
  f.world_size = 2, f.hidden_size = 64, f.micro_batch_size = 2, f.gradient_accumulation_steps = 1;
  f.lr = 1e-4, f.weight_decay = 0.0, f.betas = std::array<double, 2>{0.9, 0.999}, f.eps = 1e-8;
  f.gradient_clipping = 1.0, f.warmup_steps = 10, f.mixed_precision = "bf16";
  const Config r = resolve_auto(c, f);
  CHECK(r.zero_optimization.stage3_gather_16bit_weights_on_model_save.is_auto);
  const auto pending = pending_auto(r);
  REQUIRE(pending.size() == 1);
  CHECK(pending[0].first == "zero_optimization.stage3_gather_16bit_weights_on_model_save");
  CHECK_THAT(pending[0].second, Catch::Contains("save"));
  // With the fact, it is resolved like any other.
  f.save_16bit_model = true;
  CHECK(resolve_auto(c, f).zero_optimization.stage3_gather_16bit_weights_on_model_save == Auto<bool>(true));
  // Negative control: a fact the engine needs still fails strict resolution, naming its key.
  f.lr.reset();
  CHECK_THROWS_WITH(resolve_auto(c, f), Catch::Contains("optimizer.params.lr"));
}

TEST_CASE("[tessera.rollout]: given values are read, the default policy is lowest", "[config][load]") {
  const Config none = load_toml("train_micro_batch_size_per_gpu = 1\n");
  CHECK(none.tessera.rollout == RolloutConfig{});
  CHECK(none.tessera.rollout.replica_policy == tessera::affine::ReplicaPolicyKind::lowest);
  CHECK(none.tessera.rollout.replica_policy == tessera::affine::kDefaultReplicaPolicy);
  const Config given = load_toml(
      "[tessera.rollout]\nreplica_policy = \"balanced\"\nstaging_budget_bytes = 4096\nsync_timeout_ms = 2500\n");
  CHECK(given.tessera.rollout.replica_policy == tessera::affine::ReplicaPolicyKind::balanced);
  CHECK(given.tessera.rollout.staging_budget_bytes == 4096);
  CHECK(given.tessera.rollout.sync_timeout_ms == 2500);
  CHECK(given.tessera.rollout.max_rounds_in_flight == RolloutConfig{}.max_rounds_in_flight);
  // A config set in code to the callback kind (no file can name it) is refused, naming the key.
  Config coded = none;
  coded.tessera.rollout.replica_policy = tessera::affine::ReplicaPolicyKind::callback;
  CHECK_THAT(config_error([&] { validate(coded); }), Catch::Contains("tessera.rollout.replica_policy"));
}

TEST_CASE("[tessera.checkpoint] keep_last: default 0 (keep every tag), >= 0, round-trips", "[load]") {
  CHECK(load_toml("train_micro_batch_size_per_gpu = 1\n").tessera.checkpoint.keep_last == 0);
  const Config given = load_toml("train_micro_batch_size_per_gpu = 1\n[tessera.checkpoint]\nkeep_last = 3\n");
  CHECK(given.tessera.checkpoint.keep_last == 3);
  CHECK(load_config_text(to_json(given), Format::json) == given);
  CHECK_THAT(config_error([&] { load_toml("train_micro_batch_size_per_gpu = 1\n[tessera.checkpoint]\nkeep_last = -1\n"); }),
             Catch::Contains("tessera.checkpoint.keep_last"));
  CHECK_THAT(config_error([&] { load_toml("train_micro_batch_size_per_gpu = 1\n[tessera.checkpoint]\nkeep_lst = 2\n"); }),
             Catch::Contains("keep_lst"));
}

TEST_CASE("DeepSpeed's checkpoint block: tag_validation read in any case, its writer switches ignored, node-local storage refused",
          "[config][load]") {
  const auto json = [](const std::string& block) {
    return load_config_text("{\"train_micro_batch_size_per_gpu\": 1, \"checkpoint\": " + block + "}", Format::json, "ckpt.json");
  };
  CHECK(json("{}").checkpoint.tag_validation == TagValidation::warn);  // DeepSpeed's default
  CHECK(json("{\"tag_validation\": \"FAIL\"}").checkpoint.tag_validation == TagValidation::fail);
  CHECK(json("{\"tag_validation\": \"Ignore\"}").checkpoint.tag_validation == TagValidation::ignore);
  const std::string bad = config_error([&] { json("{\"tag_validation\": \"Sometimes\"}"); });
  CHECK_THAT(bad, Catch::Contains("checkpoint.tag_validation") && Catch::Contains("Sometimes"));
  const Config c = json(
      "{\"tag_validation\": \"Warn\", \"load_universal\": true, \"checkpoint_serialization\": false, "
      "\"writer\": {\"type\": \"fast\"}, \"parallel_write\": {\"pipeline_stage\": false}, \"use_node_local_storage\": true}");
  CHECK(has_warning(c, "checkpoint.load_universal"));
  CHECK(has_warning(c, "checkpoint.writer"));
  REQUIRE(c.unsupported.size() == 1);
  CHECK(c.unsupported[0].path == "checkpoint.use_node_local_storage");
  CHECK(json("{\"use_node_local_storage\": false}").unsupported.empty());
  // Written back as DeepSpeed spells it, and read again the same.
  const Config again = load_config_text(to_json(json("{\"tag_validation\": \"fail\"}")), Format::json, "again.json");
  CHECK(again.checkpoint.tag_validation == TagValidation::fail);
}
