// The restricted unpickler and torch.save archives (core/checkpoint/deepspeed/) on DeepSpeed's own
// files (../shared/fixtures/deepspeed_checkpoints, written by DeepSpeed v0.14.5; their contents are
// listed in its README.md) and on hand-made pickles: what is refused, and that it is named.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/checkpoint/deepspeed/restricted_unpickler.h"
#include "core/checkpoint/deepspeed/torch_archive.h"
#include "core/error.h"

namespace fs = std::filesystem;
using namespace tessera::checkpoint::deepspeed;
using tessera::CheckpointError;

namespace {

// The fixtures are part of the test: absent, every test here fails saying where it looked.
std::string fixture(const std::string& relative) {
  const fs::path path = fs::path(TESSERA_DS_FIXTURES) / relative;
  INFO("DeepSpeed fixture " << path << " (../shared/fixtures/deepspeed_checkpoints)");
  REQUIRE(fs::exists(path));
  return path.string();
}

std::string bytes(std::initializer_list<int> values) {
  std::string s;
  for (int v : values) s.push_back(char(v));
  return s;
}

std::vector<float> floats(const std::vector<char>& b) {
  std::vector<float> f(b.size() / 4);
  std::memcpy(f.data(), b.data(), b.size());
  return f;
}

}  // namespace

TEST_CASE("ZeRO-1 optimizer states: every field the README lists, read as data", "[deepspeed][pickle]") {
  TorchArchive a(fixture("z1_fp32/global_step5/zero_pp_rank_1_mp_rank_00_optim_states.pt"));
  const auto& osd = a.root().at("optimizer_state_dict", "root");
  CHECK(osd.at("zero_stage", "").kind == PickleKind::enum_member);
  CHECK(osd.at("zero_stage", "").integer == 1);
  CHECK(osd.at("loss_scaler", "").text == "deepspeed.runtime.fp16.loss_scaler.LossScaler");
  CHECK(osd.at("loss_scaler", "").at("cur_scale", "").as_double("") == 1.0);
  CHECK_FALSE(osd.at("loss_scaler", "").at("dynamic", "").as_bool(""));
  CHECK(osd.at("partition_count", "").as_sequence("")[0]->as_int("") == 2);
  const auto& mappings = *osd.at("param_slice_mappings", "").as_sequence("")[0];
  REQUIRE(mappings.entries.size() == 6);
  CHECK(mappings.at("2.weight", "").at("start", "").as_int("") == 5624);  // 5560 + 64
  CHECK(mappings.at("2.weight", "").at("numel", "").as_int("") == 4096);
  const auto& state = osd.at("base_optimizer_state", "").at("state", "").at(int64_t{0}, "");
  const auto& step = state.at("step", "").as_tensor("");
  CHECK(step.shape.empty());
  CHECK(floats(a.read(step, "step")) == std::vector<float>{5.0f});
  const auto& master = osd.at("single_partition_of_fp32_groups", "").as_sequence("")[0]->as_tensor("");
  CHECK(master.shape == std::vector<int64_t>{10824});
  CHECK(a.read(master, "master").size() == 10824 * 4);
  CHECK(osd.at("base_optimizer_state", "").at("param_groups", "").as_sequence("")[0]->at("lr", "").as_double("") == 0.001);
}

TEST_CASE("Model states: views of one storage, torch.Size, set, counters", "[deepspeed][pickle]") {
  TorchArchive a(fixture("z2_fp32/global_step5/mp_rank_00_model_states.pt"));
  const auto& root = a.root();
  CHECK(root.at("global_steps", "").as_int("") == 5);
  CHECK(root.at("dp_world_size", "").as_int("") == 2);
  CHECK(root.at("sparse_tensor_module_names", "").kind == PickleKind::set);
  const auto& shapes = *root.at("param_shapes", "").as_sequence("")[0];
  REQUIRE(shapes.entries.size() == 6);
  CHECK(shapes.entries[0].first->text == "0.weight");
  CHECK(shapes.entries[0].second->as_sequence("")[1]->as_int("") == 256);
  const auto& bias = root.at("module", "").at("0.bias", "").as_tensor("");
  CHECK(bias.offset == 16384);
  CHECK(bias.storage.elements == 21648);
  // The view starts where 0.weight's 16384 elements end in the one flat storage.
  const auto all = floats(a.read(TensorRef{bias.storage, 0, {21648}, {1}}, "flat"));
  const auto b = floats(a.read(bias, "0.bias"));
  REQUIRE(b.size() == 64);
  CHECK(std::equal(b.begin(), b.end(), all.begin() + 16384));
}

TEST_CASE("Every fixture file unpickles", "[deepspeed][pickle]") {
  int files = 0;
  for (const auto& e : fs::recursive_directory_iterator(fixture(""))) {
    if (e.path().extension() != ".pt" && e.path().extension() != ".bin") continue;
    INFO(e.path());
    TorchArchive a(e.path().string());
    CHECK(a.root().kind != PickleKind::none);
    ++files;
  }
  CHECK(files == 37);
}

TEST_CASE("A global outside the list is refused by name, nothing is called", "[deepspeed][pickle]") {
  // pickle.dumps of os.system('true') at protocol 2: GLOBAL 'posix system', a tuple, REDUCE.
  const auto evil = bytes({0x80, 2}) + "cposix\nsystem\nq\x00X\x04\x00\x00\x00true" + bytes({0x85, 'R', '.'});
  CHECK_THROWS_WITH(unpickle(evil, "evil.pt"), Catch::Contains("evil.pt") && Catch::Contains("'posix.system'") &&
                                                   Catch::Contains("refused"));
  const auto os_system = bytes({0x80, 2}) + "cos\nsystem\n" + bytes({')', 'R', '.'});
  CHECK_THROWS_WITH(unpickle(os_system, "x.pt"), Catch::Contains("'os.system'"));
  // A known class may not be called as a function it is not: LossScaler through REDUCE.
  const auto call = bytes({0x80, 2}) + "cdeepspeed.runtime.fp16.loss_scaler\nLossScaler\n" + bytes({')', 'R', '.'});
  CHECK_THROWS_WITH(unpickle(call, "y.pt"), Catch::Contains("y.pt") && Catch::Contains("LossScaler"));
}

TEST_CASE("Unknown and refused opcodes are named", "[deepspeed][pickle]") {
  CHECK_THROWS_WITH(unpickle(bytes({0x80, 2, 'i'}) + "os\nsystem\n.", "a.pt"), Catch::Contains("INST"));
  CHECK_THROWS_WITH(unpickle(bytes({0x80, 2, 0x82, 1, '.'}), "a.pt"), Catch::Contains("EXT1"));
  CHECK_THROWS_WITH(unpickle(bytes({0x80, 2, 0xff}), "a.pt"), Catch::Contains("unknown (0xff)"));
  CHECK_THROWS_WITH(unpickle(bytes({0x80, 2, 'X', 9, 0}), "a.pt"), Catch::Contains("truncated"));
  CHECK_THROWS_WITH(unpickle(bytes({0x80, 2, 'h', 3, '.'}), "a.pt"), Catch::Contains("memo entry 3"));
}

TEST_CASE("Plain values: ints of every width, floats, nested containers, memo", "[deepspeed][pickle]") {
  // {'a': [1, -2, 70000, 2**40, 0.5, None, True], 'b': <the same list>} (protocol 2, memoized list).
  const auto p = bytes({0x80, 2, '}', 'q', 0, '(', 'X', 1, 0, 0, 0, 'a', ']', 'q', 1, '(', 'K', 1, 'J', 0xfe, 0xff, 0xff,
                        0xff, 'J', 0x70, 0x11, 1, 0, 0x8a, 6, 0, 0, 0, 0, 0, 1, 'G', 0x3f, 0xe0, 0, 0, 0, 0, 0, 0, 'N',
                        0x88, 'e', 'X', 1, 0, 0, 0, 'b', 'h', 1, 'u', '.'});
  const auto v = unpickle(p, "p");
  const auto& a = v->at("a", "").as_sequence("");
  REQUIRE(a.size() == 7);
  CHECK(a[0]->integer == 1);
  CHECK(a[1]->integer == -2);
  CHECK(a[2]->integer == 70000);
  CHECK(a[3]->integer == (int64_t{1} << 40));
  CHECK(a[4]->floating == 0.5);
  CHECK(a[5]->is_none());
  CHECK(a[6]->boolean);
  CHECK(&v->at("b", "") == &v->at("a", ""));
}

TEST_CASE("A truncated archive is refused naming the file", "[deepspeed][pickle]") {
  const auto source = fixture("z1_fp32/global_step5/zero_pp_rank_0_mp_rank_00_optim_states.pt");
  const auto path = fs::temp_directory_path() / "tessera_ds_truncated.pt";
  {
    std::ifstream in(source, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(all.data(), long(all.size() / 2));
  }
  CHECK_THROWS_WITH(TorchArchive(path.string()), Catch::Contains(path.string()));
  CHECK_THROWS_WITH(TorchArchive("/nonexistent/x.pt"), Catch::Contains("/nonexistent/x.pt") && Catch::Contains("missing"));
  fs::remove(path);
}
