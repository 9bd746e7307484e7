// Writing: every loaded configuration written as TOML or JSON reads back equal.
#include <catch2/catch.hpp>

#include <algorithm>
#include <dirent.h>

#include "core/config/resolve_auto.h"
#include "core/config/write.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::load_json;
using tessera::config::test::source_path;

namespace {
std::vector<std::string> all_config_files() {
  std::vector<std::string> out;
  for (const std::string& dir : {source_path("configs"), source_path("configs/deepspeed")}) {
    if (DIR* d = opendir(dir.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.find(".toml") != std::string::npos || name.find(".json") != std::string::npos) out.push_back(dir + "/" + name);
      }
      closedir(d);
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

TEST_CASE("TOML <-> JSON round trips give equal configurations", "[config][write]") {
  const auto files = all_config_files();
  REQUIRE(files.size() >= 15);
  for (const std::string& file : files) {
    INFO(file);
    const Config original = load_config(file);
    const Config from_json = load_config_text(to_json(original), Format::json, "written.json");
    const Config from_toml = load_config_text(to_toml(original), Format::toml, "written.toml");
    CHECK(from_json == original);
    CHECK(from_toml == original);
    WriteOptions full;
    full.include_defaults = true;
    CHECK(load_config_text(to_json(original, full), Format::json, "full.json") == original);
    CHECK(load_config_text(to_toml(original, full), Format::toml, "full.toml") == original);
    // Through both syntaxes in turn.
    CHECK(load_config_text(to_toml(from_json), Format::toml, "again.toml") == original);
    CHECK(from_json.unsupported == original.unsupported);
  }
}

TEST_CASE("resolved configurations round-trip too", "[config][write]") {
  Facts f;
  f.world_size = 4, f.hidden_size = 2048, f.micro_batch_size = 2, f.lr = 3e-4, f.weight_decay = 0.1;
  f.betas = std::array<double, 2>{0.9, 0.95}, f.eps = 1e-8, f.gradient_clipping = 1.0, f.warmup_steps = 10;
  f.total_steps = 100, f.mixed_precision = "bf16", f.gradient_accumulation_steps = 2;
  const Config r = resolve_auto(load_config(source_path("configs/deepspeed/hf_ds_config_zero3.json")), f);
  CHECK(load_config_text(to_toml(r), Format::toml) == r);
  CHECK(load_config_text(to_json(r), Format::json) == r);
  // Values set by hand after loading (no provenance) are written too.
  Config edited = r;
  edited.zero_optimization.stage = Auto<std::int64_t>(2);
  edited.zero_optimization.offload_param.device = Auto<OffloadDevice>(OffloadDevice::none);
  edited.tessera.rollout.replica_policy = tessera::affine::ReplicaPolicyKind::local;
  CHECK(load_config_text(to_json(edited), Format::json) == edited);
  CHECK(load_config_text(to_toml(edited), Format::toml) == edited);
}

TEST_CASE("the written JSON is DeepSpeed's shape", "[config][write]") {
  const Config c = load_json(R"({"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 3,
      "reduce_bucket_size": "auto", "offload_param": {"device": "cpu"}}, "flops_profiler": {"enabled": true},
      "optimizer": {"type": "adamw", "params": {"lr": 1e-4}}})");
  const std::string json = to_json(c);
  CHECK_THAT(json, Catch::Contains("\"reduce_bucket_size\": \"auto\""));
  CHECK_THAT(json, Catch::Contains("\"type\": \"AdamW\""));  // canonical spelling
  CHECK_THAT(json, Catch::Contains("\"flops_profiler\": {"));  // passed through
  CHECK_THAT(json, Catch::Contains("\"overlap_comm\": true"));  // stage 3's default differs from stage 0's
  CHECK_THAT(json, !Catch::Contains("stage3_max_live_parameters"));  // DeepSpeed's default, not in the source
  CHECK_THAT(json, !Catch::Contains("\"tessera\""));
  WriteOptions full;
  full.include_defaults = true;
  CHECK_THAT(to_json(c, full), Catch::Contains("\"stage3_max_live_parameters\": 1000000000"));
  const std::string toml = to_toml(c);
  CHECK_THAT(toml, Catch::Contains("[zero_optimization.offload_param]\ndevice = \"cpu\""));
  CHECK_THAT(toml, Catch::Contains("reduce_bucket_size = \"auto\""));
}

TEST_CASE("equality compares settings, not bookkeeping", "[config][write]") {
  const Config a = load_json(R"({"zero_optimization": {"stage": 2}})", "a.json");
  Config b = load_json(R"({"zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8}})", "b.json");
  CHECK(a == b);  // 5e8 is the default; where it came from differs
  b.zero_optimization.reduce_bucket_size = Auto<std::int64_t>::automatic();
  CHECK(a != b);
}

TEST_CASE("awkward strings and keys survive both syntaxes", "[config][write]") {
  const Config c = load_json(R"({"wandb": {"project": "a \"quoted\" name\\with\tbackslash", "odd.key": 1, "über": "ß"},
      "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/mnt/nvme disk/ü"}},
      "torch_autocast": {"lower_precision_safe_modules": []}, "gradient_clipping": 1.0, "fp16": {"min_loss_scale": 1e-05}})");
  CHECK(load_config_text(to_toml(c), Format::toml) == c);
  CHECK(load_config_text(to_json(c), Format::json) == c);
  CHECK_THAT(to_json(c), Catch::Contains("\"gradient_clipping\": 1.0"));
}
