// `tessera config check|convert` run as processes: exit codes and output.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sys/wait.h>

#include "core/config/load.h"

namespace {

struct Run {
  int exit_code;
  std::string output;  // stdout and stderr together
};

Run run(const std::string& arguments) {
  const std::string command = std::string(TESSERA_BINARY) + " " + arguments + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string output;
  char buffer[4096];
  while (std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  return Run{WIFEXITED(status) ? WEXITSTATUS(status) : -1, output};
}

std::string src(const std::string& relative) { return std::string(TESSERA_SOURCE_DIR) + "/" + relative; }

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = std::string(TESSERA_TEST_TMP) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

TEST_CASE("config check prints each value with its provenance", "[config][cli]") {
  const Run r = run("config check " + src("configs/deepspeed/accelerate_zero_stage2_config.json"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("valid DeepSpeed JSON configuration"));
  CHECK_THAT(r.output, Catch::Contains("gradient_accumulation_steps = 1"));
  CHECK_THAT(r.output, Catch::Contains("# given"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.sub_group_size = 1000000000"));
  CHECK_THAT(r.output, Catch::Contains("# default"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.reduce_bucket_size = \"auto\""));
  CHECK_THAT(r.output, Catch::Contains("# auto: waits for the model's hidden size (--hidden-size)"));
  CHECK_THAT(r.output, Catch::Contains("auto values resolved when the engine starts"));
}

TEST_CASE("config check resolves auto values from the facts given", "[config][cli]") {
  const Run r = run("config check " + src("configs/deepspeed/accelerate_zero_stage3_offload_config.json") +
                    " --world-size 2 --hidden-size 1280 --micro-batch 32 --lr 5e-4");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("train_batch_size = 64"));
  CHECK_THAT(r.output, Catch::Contains("derived: 32 x 1 x 2"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.stage3_prefetch_bucket_size = 1474560"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.stage3_param_persistence_threshold = 12800"));
  CHECK_THAT(r.output, Catch::Contains("optimizer.params.lr = 0.0005"));
  // weight decay was not given: still auto, and not an error here.
  CHECK_THAT(r.output, Catch::Contains("optimizer.params.weight_decay = \"auto\""));
}

TEST_CASE("config check --strict fails on unresolved auto values", "[config][cli]") {
  const Run r = run("config check --strict " + src("configs/deepspeed/accelerate_zero_stage2_config.json") + " --world-size 2");
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.reduce_bucket_size: \"auto\" cannot be resolved"));
}

TEST_CASE("config check passes Transformers' ZeRO-3 test file, the 16-bit save flag pending", "[config][cli]") {
  const std::string file = src("configs/deepspeed/hf_tests_ds_config_zero3.json");
  Run r = run("config check " + file);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.stage3_gather_16bit_weights_on_model_save: waits for the save call"));
  // --strict with every fact but the save flag: still valid (the save call decides it).
  r = run("config check --strict " + file +
          " --world-size 2 --hidden-size 64 --micro-batch 2 --grad-accum 1 --lr 1e-4 --weight-decay 0 --betas 0.9,0.999"
          " --eps 1e-8 --grad-clip 1 --warmup-steps 10 --mixed-precision bf16");
  CHECK(r.exit_code == 0);
}

TEST_CASE("config check accepts Transformers' ZeRO-3 test file with zero bucket sizes", "[config][cli]") {
  // tests/deepspeed/ds_config_zero3.json of huggingface/transformers: DeepSpeed takes
  // reduce_bucket_size 0 (ge=0), and so must tessera.
  const Run r = run("config check " + src("configs/deepspeed/hf_tests_ds_config_zero3_zero_buckets.json"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("valid DeepSpeed JSON configuration"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.reduce_bucket_size = 0"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.stage3_prefetch_bucket_size = 0"));
}

TEST_CASE("config check lists ignored and not-yet-supported keys without failing", "[config][cli]") {
  Run r = run("config check " + src("configs/deepspeed/zeropp.json"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("not yet supported, refused when the engine starts (3)"));
  CHECK_THAT(r.output, Catch::Contains("zero_optimization.zero_quantized_gradients = true: not yet supported"));
  CHECK_THAT(r.output, Catch::Contains("# given; not yet supported"));
  r = run("config check " + src("configs/deepspeed/deepspeed_examples_bert.json"));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("warning: flops_profiler: accepted and ignored"));
  CHECK_THAT(r.output, Catch::Contains("flops_profiler = {"));
  CHECK_THAT(r.output, Catch::Contains("# ignored"));
}

TEST_CASE("config check lists AutoTP training as not yet supported, and offload to host memory or NVMe not", "[config][cli]") {
  // The README promises keys the engine refuses are listed; AutoTP is refused at initialize,
  // optimizer and parameter offload to host memory and to NVMe are not.
  Run r = run("config check " + src("configs/deepspeed/accelerate_zero_stage3_offload_config.json"));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, !Catch::Contains("not yet supported, refused when the engine starts"));
  CHECK_THAT(r.output, !Catch::Contains("offload_optimizer.device = \"cpu\": not yet supported"));
  CHECK_THAT(r.output, !Catch::Contains("offload_param.device = \"cpu\": not yet supported"));
  const std::string nvme = write_temp("nvme_offload.toml",
                                      "[zero_optimization]\nstage = 3\n\n[zero_optimization.offload_optimizer]\n"
                                      "device = \"nvme\"\nnvme_path = \"/tmp\"\n\n[zero_optimization.offload_param]\n"
                                      "device = \"nvme\"\nnvme_path = \"/tmp\"\n");
  r = run("config check " + nvme);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, !Catch::Contains("offload_optimizer.device = \"nvme\": not yet supported"));
  CHECK_THAT(r.output, !Catch::Contains("offload_param.device = \"nvme\": not yet supported"));
  CHECK_THAT(r.output, !Catch::Contains("not yet supported, refused when the engine starts"));
  r = run("config check " + src("configs/autotp.toml"));
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("tensor_parallel.autotp_size = "));
  CHECK_THAT(r.output, Catch::Contains(": not yet supported (AutoTP tensor-parallel training)"));
}

TEST_CASE("config check fails with the errors and exit status 1", "[config][cli]") {
  const std::string bad = write_temp("bad_config.toml", "[zero_optimization]\nstage = 2\n\n[zero_optimization.offload_param]\ndevice = \"cpu\"\n");
  Run r = run("config check " + bad);
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("bad_config.toml:5: zero_optimization.offload_param.device: \"cpu\" needs ZeRO stage 3"));
  r = run("config check /nonexistent.json");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("cannot read"));
}

TEST_CASE("config convert writes the other syntax, which loads back equal", "[config][cli]") {
  for (const std::string to : {"json", "toml"}) {
    const std::string out = std::string(TESSERA_TEST_TMP) + "/converted_autotp." + to;
    const Run r = run("config convert " + src("configs/autotp.toml") + " --to " + to + " -o " + out);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(tessera::config::load_config(out) == tessera::config::load_config(src("configs/autotp.toml")));
  }
  const Run stdout_run = run("config convert " + src("configs/deepspeed/hf_ds_config_zero2.json") + " --to toml");
  CHECK(stdout_run.exit_code == 0);
  CHECK_THAT(stdout_run.output, Catch::Contains("[zero_optimization.offload_optimizer]"));
  const Run bad = run("config convert " + src("configs/zero1.toml") + " --to yaml");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.output, Catch::Contains("--to"));
}

TEST_CASE("config commands have --help", "[config][cli]") {
  Run r = run("config --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("check"));
  CHECK_THAT(r.output, Catch::Contains("convert"));
  r = run("config check --help");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("--hidden-size"));
}
