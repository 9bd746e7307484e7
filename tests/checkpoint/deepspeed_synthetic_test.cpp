// import_deepspeed() on the paths DeepSpeed's own small fixtures do not show, through SYNTHETIC
// checkpoints: make_ds_checkpoint.py (run here with Debian's /usr/bin/python3 and its torch 1.13)
// writes them with the structure ../shared/fixtures/deepspeed_checkpoints/README.md documents for
// DeepSpeed v0.14.5's files (stand-in classes under DeepSpeed's module paths; not written by
// DeepSpeed), and beside them the full fp32 masters, Adam states and 16-bit weights per parameter
// (raw little-endian) and the counters. Each import is verified, then every parameter's stored
// master, exp_avg, exp_avg_sq and param is read back through SavedTensorReader (planned across the
// rank files) and compared bitwise with what the generator started from:
//   z2_bf16_w3_groups   bf16 ZeRO-2, 3 ranks, two parameter groups interleaved in the model, padding
//                       on the last rank of both groups, gradient accumulation 2
//   z1_fp16_dynamic     fp16 ZeRO-1, 2 ranks, a DynamicLossScaler (scale, iteration, last overflow,
//                       hysteresis) after 2 skipped steps of 7, padding on the last rank
//   z3_bf16_subgroups   bf16 ZeRO-3, 2 ranks, two groups, three sub-groups, per-tensor padding
//   z2_bf16_frozen      the first with a frozen parameter: imported whole into rank 0's file
//   z3_bf16_frozen      bf16 ZeRO-3, 2 ranks, two frozen parameters whose partitions (one padded)
//                       lie in both ranks' model-states files
// Frozen parameters are compared with the generator's whole tensors too.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checkpoint/consolidate.h"
#include "core/checkpoint/deepspeed/import.h"
#include "core/checkpoint/manifest.h"
#include "core/checkpoint/saved_tensor_reader.h"
#include "core/checkpoint/verify.h"
#include "core/error.h"

namespace fs = std::filesystem;
namespace ck = tessera::checkpoint;
using nlohmann::json;

namespace {

// The generator's output, written once per test process and removed at its exit.
struct Generated {
  fs::path dir = fs::temp_directory_path() / ("tessera_ds_synthetic_" + std::to_string(::getpid()));
  int rc = -1;
  Generated() {
    fs::remove_all(dir);
    const std::string command = std::string("/usr/bin/python3 '") + TESSERA_DS_GENERATOR + "' '" + dir.string() + "'";
    rc = std::system(command.c_str());
  }
  ~Generated() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

fs::path generated(const std::string& name) {
  static Generated g;
  INFO("make_ds_checkpoint.py with /usr/bin/python3 (Debian's python3-torch) into " << g.dir);
  REQUIRE(g.rc == 0);
  return g.dir / name;
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  INFO(path);
  REQUIRE(in.good());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("tessera_ds_synthetic_out_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

void check_counters(const ck::Manifest& m, const json& c) {
  CHECK(m.stage == c["stage"].get<int>());
  CHECK(m.world_size == c["world"].get<int>());
  CHECK(m.dtype == c["dtype"].get<std::string>());
  std::vector<std::string> names;
  for (const auto& p : m.parameters) names.push_back(p.name);
  CHECK(names == c["parameters"].get<std::vector<std::string>>());  // model order, not flat order
  CHECK(m.engine.global_steps == c["global_steps"].get<int64_t>());
  CHECK(m.engine.skipped_steps == c["skipped_steps"].get<int64_t>());
  CHECK(m.engine.micro_steps == c["micro_steps"].get<int64_t>());
  CHECK(m.engine.optimizer_updates == c["optimizer_step"].get<int64_t>());
  CHECK(m.engine.group_lrs == c["group_lrs"].get<std::vector<double>>());
  CHECK(m.kinds == std::vector<std::string>{"param", "master", "exp_avg", "exp_avg_sq"});
  CHECK(m.engine.has_loss_scaler == c.contains("loss_scaler"));
  if (!c.contains("loss_scaler")) return;
  const auto& s = c["loss_scaler"];
  CHECK(m.engine.loss_scaler.scale == s["scale"].get<double>());
  CHECK(m.engine.loss_scaler.iteration == s["iteration"].get<int64_t>());
  CHECK(m.engine.loss_scaler.last_overflow_iteration == s["last_overflow_iteration"].get<int64_t>());
  CHECK(m.engine.loss_scaler.hysteresis_left == s["hysteresis_left"].get<int64_t>());
  CHECK(m.engine.loss_scaler.skipped_steps == c["skipped_steps"].get<int64_t>());
}

// The bytes of tensor `name` in a safetensors file (its header read here, not by tessera's reader).
std::string safetensors_bytes(const fs::path& path, const std::string& name) {
  const auto all = file_bytes(path);
  uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  const auto header = json::parse(all.substr(8, size_t(n)));
  INFO(path << " tensor " << name);
  REQUIRE(header.contains(name));
  const auto offsets = header[name]["data_offsets"];
  return all.substr(size_t(8 + n + offsets[0].get<uint64_t>()), size_t(offsets[1].get<uint64_t>() - offsets[0].get<uint64_t>()));
}

// Imports the case, verifies it, and compares every stored tensor with the generator's.
void check_case(const std::string& name) {
  const auto dir = generated(name);
  const auto c = json::parse(file_bytes(dir / "expected" / "counters.json"));
  const auto out = scratch(name);
  const auto report = ck::deepspeed::import_deepspeed((dir / "ckpt").string(), out.string());
  CHECK(report.stage == c["stage"].get<int>());
  CHECK(report.world == c["world"].get<int>());
  const auto tag_dir = (out / ("global_step" + std::to_string(c["global_steps"].get<int>()))).string();
  const auto verified = ck::verify_tag(tag_dir);
  INFO(verified.problems.size() << " problems, first: " << (verified.problems.empty() ? "" : verified.problems[0]));
  CHECK(verified.ok());
  const auto m = ck::read_manifest(tag_dir);
  check_counters(m, c);
  ck::SavedTensorReader reader(m, tag_dir);
  std::map<std::string, int> compared;  // kind -> tensors
  for (const auto& saved : m.maps) {
    INFO(saved.kind << " of " << saved.map.name);
    std::string tensor(size_t(saved.map.numel() * tessera::affine::element_size(saved.map.dtype)), '\0');
    reader.read(saved, reader.plan(saved), tensor.data());
    CHECK(tensor == file_bytes(dir / "expected" / (saved.map.name + "." + saved.kind)));
    ++compared[saved.kind];
  }
  const int n = int(c["parameters"].size());
  CHECK(compared == std::map<std::string, int>{{"param", n}, {"master", n}, {"exp_avg", n}, {"exp_avg_sq", n}});
  // Frozen parameters: whole in rank 0's file, bitwise the generator's (ZeRO-3: partitions merged).
  std::vector<std::string> frozen;
  for (const auto& f : m.frozen) {
    INFO("frozen " << f.name);
    frozen.push_back(f.name);
    CHECK(f.file == 0);
    const auto& buffer = *m.file_of_rank(0).find(f.buffer);
    const auto bytes = file_bytes(fs::path(tag_dir) / m.file_of_rank(0).file)
                           .substr(size_t(buffer.data_offset), size_t(buffer.elements * tessera::affine::element_size(buffer.dtype)));
    CHECK(tessera::affine::dtype_name(f.dtype) == c["dtype"].get<std::string>());
    CHECK(bytes == file_bytes(dir / "expected" / (f.name + ".frozen")));
  }
  CHECK(frozen == c["frozen"].get<std::vector<std::string>>());
  if (!frozen.empty()) {  // consolidation (zero_to_fp32) writes them too, in their dtype, unless excluded
    const auto whole = scratch(name + "_consolidated");
    ck::consolidate(tag_dir, whole.string());
    for (const auto& f : frozen)
      CHECK(safetensors_bytes(whole / "model.safetensors", f) == file_bytes(dir / "expected" / (f + ".frozen")));
    CHECK(safetensors_bytes(whole / "model.safetensors", m.parameters[0].name) ==
          file_bytes(dir / "expected" / (m.parameters[0].name + ".master")));
    const auto without = scratch(name + "_without_frozen");
    ck::ConsolidateOptions options;
    options.exclude_frozen_parameters = true;
    CHECK(ck::consolidate(tag_dir, without.string(), options).tensors == int64_t(m.parameters.size()));
    fs::remove_all(whole);
    fs::remove_all(without);
  }
  fs::remove_all(out);
}

}  // namespace

TEST_CASE("Synthetic bf16 ZeRO-2: 2 groups, padding on the last of 3 ranks, masters and bf16 weights bitwise",
          "[deepspeed][synthetic]") {
  check_case("z2_bf16_w3_groups");
}

TEST_CASE("Synthetic fp16 ZeRO-1 with a dynamic loss scaler: its state in the manifest, tensors bitwise",
          "[deepspeed][synthetic]") {
  check_case("z1_fp16_dynamic");
}

TEST_CASE("Synthetic bf16 ZeRO-3: 2 groups in 3 sub-groups, padded shares, tensors bitwise", "[deepspeed][synthetic]") {
  check_case("z3_bf16_subgroups");
}

TEST_CASE("Synthetic bf16 ZeRO-2 with a frozen parameter: imported whole beside the trainable ones",
          "[deepspeed][synthetic]") {
  check_case("z2_bf16_frozen");
}

TEST_CASE("Synthetic bf16 ZeRO-3 with frozen parameters: each rank's partition merged, padding dropped",
          "[deepspeed][synthetic]") {
  check_case("z3_bf16_frozen");
}
