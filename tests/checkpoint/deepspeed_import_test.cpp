// import_deepspeed() (core/checkpoint/deepspeed/import.h) on DeepSpeed v0.14.5's own checkpoints
// (../shared/fixtures/deepspeed_checkpoints): the result passes verify; its fp32 weights, through
// tessera's consolidate, equal DeepSpeed's zero_to_fp32 output bitwise and give the digest DeepSpeed
// printed after 5 steps (d39d9ee736d02b07: sha256 over the float32 bytes of the parameters in
// model order, first 16 hex digits); masters and Adam states equal the DeepSpeed ranks' partitions
// gathered by hand. The universal format (z2_fp32_universal) imports into the very files the sharded
// z2_fp32 does. Bad inputs are refused naming the file, with nothing written.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checkpoint/consolidate.h"
#include "core/checkpoint/deepspeed/ds_checkpoint.h"
#include "core/checkpoint/deepspeed/import.h"
#include "core/checkpoint/deepspeed/torch_archive.h"
#include "core/checkpoint/saved_tensor_reader.h"
#include "core/checkpoint/verify.h"
#include "core/error.h"
#include "tests/checkpoint/fixture_digest.h"

namespace fs = std::filesystem;
namespace ck = tessera::checkpoint;
using namespace tessera::checkpoint::deepspeed;

namespace {

const std::vector<std::string> kNames = {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"};

std::string fixture(const std::string& relative) {
  const fs::path path = fs::path(TESSERA_DS_FIXTURES) / relative;
  INFO("DeepSpeed fixture " << path << " (../shared/fixtures/deepspeed_checkpoints)");
  REQUIRE(fs::exists(path));
  return path.string();
}

fs::path scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("tessera_ds_import_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(dir);
  return dir;
}

std::string digest(const std::vector<std::vector<char>>& tensors) {
  std::vector<std::pair<const void*, size_t>> bytes;
  for (const auto& t : tensors) bytes.emplace_back(t.data(), t.size());
  return tessera::testing::fixture_digest(bytes);
}

// A torch.save'd OrderedDict of tensors (pytorch_model.bin), read with our own reader.
std::vector<std::vector<char>> bin_tensors(const std::string& path) {
  TorchArchive a(path);
  std::vector<std::vector<char>> out;
  for (const auto& name : kNames) out.push_back(a.read(a.root().at(name, path).as_tensor(name), name));
  return out;
}

void copy_tree(const fs::path& from, const fs::path& to) {
  fs::copy(from, to, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(to))
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
}

}  // namespace

TEST_CASE("Each ZeRO stage imports into a checkpoint verify accepts, whose weights are DeepSpeed's", "[deepspeed][import]") {
  const auto reference = bin_tensors(fixture("z3_fp32_consolidated/pytorch_model.bin"));
  CHECK(digest(reference) == "d39d9ee736d02b07");
  for (const std::string name : {"z1_fp32", "z2_fp32", "z3_fp32"}) {
    INFO(name);
    const auto out = scratch(name);
    const auto report = import_deepspeed(fixture(name), out.string());
    CHECK(report.tag == "global_step5");
    CHECK(report.world == 2);
    CHECK(report.stage == (name == "z1_fp32" ? 1 : name == "z2_fp32" ? 2 : 3));
    CHECK(report.elements == 21648);
    const auto tag_dir = (out / "global_step5").string();
    const auto verified = ck::verify_tag(tag_dir);
    INFO(verified.problems.size() << " problems, first: " << (verified.problems.empty() ? "" : verified.problems[0]));
    CHECK(verified.ok());
    const auto m = ck::read_manifest(tag_dir);
    CHECK(m.engine.global_steps == 5);
    CHECK(m.engine.optimizer_updates == 5);
    CHECK(m.engine.micro_steps == 5);
    CHECK(m.engine.group_lrs == std::vector<double>{1e-3});
    CHECK(m.kinds == std::vector<std::string>{"param", "master", "exp_avg", "exp_avg_sq"});
    ck::ConsolidateOptions options;
    options.format = ck::ConsolidateFormat::pytorch_bin;
    const auto consolidated = scratch(name + "_fp32");
    ck::consolidate(out.string(), consolidated.string(), options);
    const auto weights = bin_tensors((consolidated / "pytorch_model.bin").string());
    CHECK(weights == reference);
    CHECK(digest(weights) == "d39d9ee736d02b07");
    fs::remove_all(out);
    fs::remove_all(consolidated);
  }
}

TEST_CASE("Adam's states, gathered from the import, are DeepSpeed's partitions in order", "[deepspeed][import]") {
  // ZeRO-2, 2 ranks: the flat group is exp_avg(rank 0) ++ exp_avg(rank 1), parameters in order.
  const auto ds = read_deepspeed_checkpoint(fixture("z2_fp32"));
  std::vector<char> flat = ds.groups[0].states.at("exp_avg")[0];
  flat.insert(flat.end(), ds.groups[0].states.at("exp_avg")[1].begin(), ds.groups[0].states.at("exp_avg")[1].end());
  const auto out = scratch("states");
  import_deepspeed(fixture("z2_fp32"), out.string());
  const auto tag_dir = (out / "global_step5").string();
  const auto m = ck::read_manifest(tag_dir);
  ck::SavedTensorReader reader(m, tag_dir);
  int64_t offset = 0;
  for (const auto& saved : m.maps) {
    if (saved.kind != "exp_avg") continue;
    std::vector<char> tensor(size_t(saved.map.numel() * 4));
    reader.read(saved, reader.plan(saved), tensor.data());
    INFO(saved.map.name);
    CHECK(std::memcmp(tensor.data(), flat.data() + offset * 4, tensor.size()) == 0);
    offset += saved.map.numel();
  }
  CHECK(offset == 21648);
  fs::remove_all(out);
}

TEST_CASE("Bad DeepSpeed checkpoints are refused naming the file, and OUT is never written", "[deepspeed][import]") {
  const auto copy = scratch("bad_src");
  copy_tree(fixture("z1_fp32"), copy);
  const auto out = scratch("bad_out");
  SECTION("a missing rank file") {
    fs::remove(copy / "global_step5" / "zero_pp_rank_1_mp_rank_00_optim_states.pt");
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()),
                      Catch::Contains("zero_pp_rank_1_mp_rank_00_optim_states.pt") && Catch::Contains("missing"));
  }
  SECTION("a truncated archive") {
    const auto f = copy / "global_step5" / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
    fs::resize_file(f, fs::file_size(f) - 1000);
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()), Catch::Contains("zero_pp_rank_0_mp_rank_00_optim_states.pt"));
  }
  SECTION("a latest naming no tag") {
    std::ofstream(copy / "latest", std::ios::trunc) << "global_step9";
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()), Catch::Contains("global_step9"));
  }
  CHECK_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    CHECK(e.path().filename().string().find("." + out.filename().string() + ".partial") == std::string::npos);
  fs::remove_all(copy);
}

TEST_CASE("The universal format imports into the very rank files and manifest of the sharded checkpoint", "[deepspeed][import]") {
  // z2_fp32_universal is ds_to_universal's output for a run like z2_fp32's (same digest after 5 steps).
  const auto sharded = scratch("sharded"), universal = scratch("universal");
  import_deepspeed(fixture("z2_fp32"), sharded.string());
  const auto report = import_deepspeed(fixture("z2_fp32_universal"), universal.string());
  CHECK(report.stage == 2);
  CHECK(report.world == 2);
  CHECK(report.elements == 21648);
  const auto tag_dir = (universal / "global_step5").string();
  CHECK(ck::verify_tag(tag_dir).ok());
  const auto ds = read_deepspeed_checkpoint(fixture("z2_fp32_universal"));
  CHECK(ds.universal);
  CHECK(ds.state_names == std::vector<std::string>{"exp_avg", "exp_avg_sq"});
  CHECK(ds.optimizer_step == 5);
  auto bytes = [](const fs::path& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const std::string f : {"rank0.safetensors", "rank1.safetensors", "manifest.json"}) {
    INFO(f);
    CHECK(bytes(universal / "global_step5" / f) == bytes(sharded / "global_step5" / f));
  }
  ck::ConsolidateOptions options;
  options.format = ck::ConsolidateFormat::pytorch_bin;
  const auto consolidated = scratch("universal_fp32");
  ck::consolidate(universal.string(), consolidated.string(), options);
  CHECK(digest(bin_tensors((consolidated / "pytorch_model.bin").string())) == "d39d9ee736d02b07");
  for (const auto& d : {sharded, universal, consolidated}) fs::remove_all(d);
}

TEST_CASE("Bad universal checkpoints are refused naming the file and the parameter", "[deepspeed][import]") {
  const auto copy = scratch("bad_universal");
  copy_tree(fixture("z2_fp32_universal"), copy);
  const auto out = scratch("bad_universal_out");
  const auto zero = copy / "global_step5" / "zero";
  SECTION("a parameter folder missing") {
    fs::remove_all(zero / "2.bias");
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()), Catch::Contains("2.bias") && Catch::Contains("missing"));
  }
  SECTION("a state one parameter lacks") {
    fs::remove(zero / "4.weight" / "exp_avg_sq.pt");
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()), Catch::Contains("4.weight") && Catch::Contains("optimizer states"));
  }
  SECTION("a tensor of another parameter's shape") {
    fs::copy_file(zero / "2.bias" / "fp32.pt", zero / "4.bias" / "fp32.pt", fs::copy_options::overwrite_existing);
    CHECK_THROWS_WITH(import_deepspeed(copy.string(), out.string()),
                      Catch::Contains("4.bias/fp32.pt") && Catch::Contains("shape [64]") && Catch::Contains("[16]"));
  }
  CHECK_FALSE(fs::exists(out));
  fs::remove_all(copy);
}

TEST_CASE("OUT that exists and is not empty is refused", "[deepspeed][import]") {
  const auto out = scratch("occupied");
  fs::create_directories(out / "something");
  CHECK_THROWS_WITH(import_deepspeed(fixture("z1_fp32"), out.string()), Catch::Contains("not an empty directory"));
  fs::remove_all(out);
}

TEST_CASE("is_deepspeed_checkpoint tells DeepSpeed directories from tessera ones", "[deepspeed][import]") {
  CHECK(is_deepspeed_checkpoint(fixture("z1_fp32")));
  CHECK(is_deepspeed_checkpoint(fixture("z3_fp32")));
  CHECK(is_deepspeed_checkpoint(fixture("z2_fp32_universal")));  // latest_universal only
  const auto out = scratch("tessera");
  import_deepspeed(fixture("z1_fp32"), out.string());
  CHECK_FALSE(is_deepspeed_checkpoint(out.string()));
  fs::remove_all(out);
}
