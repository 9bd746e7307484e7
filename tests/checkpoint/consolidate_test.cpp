// consolidate() on a checkpoint built here by hand (no engine): three tensors over two rank files
// (rows split, columns split: strided pieces, replicated on both files), hashed in 64-byte chunks
// so runs start and end inside chunks. The oracle is the values the files were written from,
// element by element; outputs are read back with tessera's safetensors reader and LibTorch's zip
// reader. The engine-saved checkpoints and Python's torch.load: tests/tools/checkpoint_consolidate.py.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <caffe2/serialize/inline_container.h>
#include <torch/torch.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/affine/builders.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/consolidate.h"
#include "core/checkpoint/hf_shards.h"
#include "core/checkpoint/manifest.h"
#include "core/error.h"
#include "core/io/safetensors.h"

namespace fs = std::filesystem;
using namespace tessera;
using namespace tessera::checkpoint;
using affine::Dims;

namespace {

constexpr int64_t kHeaderBytes = 40;  // bytes before the buffer in each rank file
constexpr int64_t kChunk = 64;

// The value every element is written as: distinct per tensor and index, exact in fp32.
float value_of(int tensor, int64_t linear) { return float(tensor * 1000 + linear) + 0.25f; }

struct Built {
  std::string root, tag_dir;
  Manifest manifest;
  std::map<std::string, std::vector<float>> oracle;  // name -> row-major values
};

// Shifts every piece of rank r by base[r] inside one buffer per rank, and fills that buffer.
void place(affine::TensorMap& map, int tensor, std::map<int, std::vector<float>>& buffers) {
  for (auto& [rank, storage] : map.ranks) {
    auto& buffer = buffers[rank];
    const int64_t base = int64_t(buffer.size());
    buffer.resize(size_t(base + storage.buffer_elements), -7.0f);
    for (auto& piece : storage.pieces) {
      piece.offset += base;
      if (piece.box.is_empty()) continue;
      Dims i = piece.box.origin;
      for (;;) {
        int64_t linear = 0;
        for (int k = 0; k < map.shape.size(); ++k) linear = linear * map.shape[k] + i[k];
        buffer[size_t(piece.address_of(i))] = value_of(tensor, linear);
        int k = piece.box.ndim() - 1;
        while (k >= 0 && ++i[k] == piece.box.end(k)) i[k] = piece.box.origin[k], --k;
        if (k < 0) break;
      }
    }
    storage.buffer_shape = Dims();
  }
}

// `changed`: one element of file 1 differs from the oracle, with its hashes recomputed (a valid
// checkpoint whose content is not the oracle's: the negative control).
Built build(const std::string& name, bool changed = false) {
  Built b;
  b.root = (fs::temp_directory_path() / ("tessera_consolidate_" + name + "_" + std::to_string(::getpid()))).string();
  fs::remove_all(b.root);
  b.tag_dir = b.root + "/step1";
  fs::create_directories(b.tag_dir);
  std::vector<affine::TensorMap> maps{
      affine::contiguous_split({"a.weight", affine::DType::f32, Dims{6, 10}}, 0, {4, 2}),
      affine::contiguous_split({"b.weight", affine::DType::f32, Dims{5, 8}}, 1, {3, 5}),
      affine::replicated({"c.bias", affine::DType::f32, Dims{7}}, 2)};
  std::map<int, std::vector<float>> buffers;
  for (size_t t = 0; t < maps.size(); ++t) {
    place(maps[t], int(t), buffers);
    auto& values = b.oracle[maps[t].name];
    for (int64_t i = 0; i < maps[t].numel(); ++i) values.push_back(value_of(int(t), i));
  }
  if (changed) buffers[1][3] += 1.0f;
  Manifest& m = b.manifest;
  m.tag = "step1", m.world_size = 2, m.stage = 3, m.dtype = "f32", m.kinds = {"master"};
  for (auto& [rank, buffer] : buffers) {
    for (auto& map : maps) map.ranks[rank].buffer_elements = int64_t(buffer.size());
    RankFile f;
    f.rank = rank, f.file = "rank" + std::to_string(rank) + ".bin";
    const int64_t bytes = int64_t(buffer.size() * sizeof(float));
    f.buffers.push_back({"master/0", affine::DType::f32, int64_t(buffer.size()), kHeaderBytes, kChunk,
                         chunk_hashes(buffer.data(), bytes, kChunk)});
    std::string content(size_t(kHeaderBytes), 'h');
    content.append(reinterpret_cast<const char*>(buffer.data()), size_t(bytes));
    std::ofstream(b.tag_dir + "/" + f.file, std::ios::binary) << content;
    f.bytes = int64_t(content.size());
    f.hash = xxh3(content.data(), content.size());
    m.files.push_back(f);
  }
  for (const auto& map : maps) {
    m.parameters.push_back({map.name, map.dtype, map.shape});
    m.maps.push_back({"master", map, {{0, "master/0"}, {1, "master/0"}}});
  }
  std::ofstream(b.tag_dir + "/" + kManifestName) << to_json(m);
  write_latest(b.root, "step1");
  return b;
}

std::vector<float> values(const at::Tensor& t) {
  auto c = t.contiguous();
  return {c.data_ptr<float>(), c.data_ptr<float>() + c.numel()};
}

// Names of the tensors whose bytes differ from the oracle (or that are missing or shaped wrong).
std::vector<std::string> differing(const Built& b, const std::map<std::string, at::Tensor>& got) {
  std::vector<std::string> out;
  for (const auto& [name, want] : b.oracle) {
    const auto it = got.find(name);
    const bool same = it != got.end() && it->second.scalar_type() == at::kFloat && it->second.numel() == int64_t(want.size()) &&
                      std::memcmp(values(it->second).data(), want.data(), want.size() * sizeof(float)) == 0;
    if (!same) out.push_back(name);
  }
  return out;
}

std::map<std::string, at::Tensor> read_safetensors(const std::string& path) {
  io::SafetensorsFile file(path);
  std::map<std::string, at::Tensor> out;
  for (const auto& t : file.header().tensors) out[t.name] = file.read(t.name);
  return out;
}

// The storages of a torch.save archive, data/<i> in declared order, as the tensors `names` (LibTorch's
// own reader; torch::pickle_load turns an OrderedDict into None, so Python's torch.load of the
// pickle itself is checked in tests/tools/checkpoint_consolidate.py). Also returns data.pkl.
std::map<std::string, at::Tensor> read_bin(const std::string& path, const std::vector<std::string>& names,
                                           std::string* pickle = nullptr) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  std::map<std::string, at::Tensor> out;
  for (size_t i = 0; i < names.size(); ++i) {
    auto [data, bytes] = reader.getRecord("data/" + std::to_string(i));
    auto t = torch::empty({int64_t(bytes / sizeof(float))}, torch::kFloat);
    std::memcpy(t.data_ptr(), data.get(), bytes);
    out[names[i]] = t;
  }
  if (pickle) {
    auto [data, bytes] = reader.getRecord("data.pkl");
    pickle->assign(static_cast<const char*>(data.get()), bytes);
  }
  CHECK(reader.hasRecord("version"));
  return out;
}

std::vector<std::string> leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".partial-") != std::string::npos) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("Consolidation writes every tensor whole, bitwise, in model order") {
  const auto b = build("whole");
  const auto out = b.root + "/out";
  const auto report = consolidate(b.root, out);
  CHECK(report.kind == "master");
  CHECK((report.files == std::vector<std::string>{"model.safetensors"}));
  CHECK(report.tensors == 3);
  CHECK(report.largest_tensor_bytes == 60 * 4);
  io::SafetensorsFile file(out + "/model.safetensors");
  CHECK(file.header().metadata.at("format") == "pt");
  std::vector<std::string> order;
  for (const auto& t : file.header().tensors) order.push_back(t.name);  // sorted by offset: the written order
  CHECK((order == std::vector<std::string>{"a.weight", "b.weight", "c.bias"}));
  CHECK((file.info("b.weight").shape == std::vector<int64_t>{5, 8}));
  CHECK(differing(b, read_safetensors(out + "/model.safetensors")).empty());
  CHECK(leftovers(b.root).empty());
  // The same from the tag directory, and into an existing empty directory.
  fs::create_directory(b.root + "/empty");
  consolidate(b.tag_dir, b.root + "/empty", {});
  CHECK(differing(b, read_safetensors(b.root + "/empty/model.safetensors")).empty());
  fs::remove_all(b.root);
}

TEST_CASE("Negative control: a checkpoint holding other values is seen as different") {
  const auto b = build("changed", true);
  consolidate(b.root, b.root + "/out");
  const auto diff = differing(b, read_safetensors(b.root + "/out/model.safetensors"));
  CHECK(diff.size() == 1);  // element 3 of file 1 is in a.weight's rows 4-5
  CHECK((!diff.empty() && diff.front() == "a.weight"));
  fs::remove_all(b.root);
}

TEST_CASE("Sharded output: the index maps every tensor to the file that holds it") {
  const auto b = build("sharded");
  ConsolidateOptions options;
  options.max_shard_bytes = 200;  // a: 240 bytes alone; b: 160; c: 28 -> [a], [b, c]
  const auto report = consolidate(b.root, b.root + "/out", options);
  CHECK((report.files == std::vector<std::string>{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                                 "model.safetensors.index.json"}));
  std::ifstream in(b.root + "/out/model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  CHECK(index["metadata"]["total_size"] == 240 + 160 + 28);
  CHECK(index["weight_map"].size() == 3);
  std::map<std::string, at::Tensor> all;
  for (const auto& [name, file] : index["weight_map"].items()) {
    const auto tensors = read_safetensors(b.root + "/out/" + file.get<std::string>());
    REQUIRE(tensors.count(name));
    all[name] = tensors.at(name);
  }
  CHECK(read_safetensors(b.root + "/out/model-00001-of-00002.safetensors").size() == 1);
  CHECK(differing(b, all).empty());
  fs::remove_all(b.root);
}

TEST_CASE("Format bin: torch.save's records, read by LibTorch's zip reader") {
  const auto b = build("bin");
  ConsolidateOptions options;
  options.format = ConsolidateFormat::pytorch_bin;
  const auto report = consolidate(b.root, b.root + "/out", options);
  CHECK((report.files == std::vector<std::string>{"pytorch_model.bin"}));
  std::string pickle;
  CHECK(differing(b, read_bin(b.root + "/out/pytorch_model.bin", {"a.weight", "b.weight", "c.bias"}, &pickle)).empty());
  for (const char* needle : {"collections\nOrderedDict\n", "torch._utils\n_rebuild_tensor_v2\n", "torch\nFloatStorage\n",
                             "b.weight", "c.bias"})
    CHECK(pickle.find(needle) != std::string::npos);
  options.max_shard_bytes = 1;  // every tensor its own file
  const auto sharded = consolidate(b.root, b.root + "/out2", options);
  CHECK(sharded.files.back() == "pytorch_model.bin.index.json");
  CHECK(differing(b, read_bin(b.root + "/out2/pytorch_model-00003-of-00003.bin", {"c.bias"})).size() == 2);  // a, b absent
  CHECK(read_bin(b.root + "/out2/pytorch_model-00003-of-00003.bin", {"c.bias"}).at("c.bias").equal(
      torch::tensor(b.oracle.at("c.bias"))));
  fs::remove_all(b.root);
}

TEST_CASE("A corrupted chunk is refused naming the file and the tensor, and nothing is written") {
  const auto b = build("corrupt");
  {  // element 3 of file 1's buffer: in a.weight's rows 4-5
    std::fstream f(b.tag_dir + "/rank1.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kHeaderBytes + 3 * 4 + 1);
    f.put('\x5a');
  }
  const auto out = b.root + "/out";
  CHECK_THROWS_WITH(consolidate(b.root, out),
                    Catch::Contains("rank1.bin: buffer 'master/0' bytes [0, 64)") && Catch::Contains("tensor 'a.weight'"));
  CHECK_FALSE(fs::exists(out));
  CHECK(leftovers(b.root).empty());
  fs::remove_all(b.root);
  // File 1 holds a's rows 4-5 (elements 0-19), b's columns 3-7 (20-44), c (45-51; read from file 0,
  // its lowest holder): element 40 (bytes 160-163) lies in chunk [128, 192), which only b reads.
  const auto later = build("corrupt_later");
  {
    std::fstream f(later.tag_dir + "/rank1.bin", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(kHeaderBytes + 40 * 4 + 2);
    f.put('\x5a');
  }
  CHECK_THROWS_WITH(consolidate(later.root, later.root + "/out"),
                    Catch::Contains("rank1.bin: buffer 'master/0' bytes [128, 192)") && Catch::Contains("tensor 'b.weight'"));
  CHECK_FALSE(fs::exists(later.root + "/out"));
  fs::remove_all(later.root);
}

TEST_CASE("Bad input is refused before anything is written") {
  const auto b = build("bad");
  const auto out = b.root + "/out";
  fs::create_directories(out + "/keep");
  CHECK_THROWS_WITH(consolidate(b.root, out), Catch::Contains("exists and is not an empty directory"));
  CHECK(fs::exists(out + "/keep"));
  fs::remove_all(out);
  CHECK_THROWS_WITH(consolidate(b.root + "/nothing", out), Catch::Contains("no 'latest' file"));
  ConsolidateOptions other_tag;
  other_tag.tag = "step9";
  CHECK_THROWS_WITH(consolidate(b.root, out, other_tag), Catch::Contains("not a committed checkpoint"));
  CHECK_THROWS_WITH(parse_consolidate_format("onnx"), Catch::Contains("unknown format 'onnx'"));
  fs::resize_file(b.tag_dir + "/rank0.bin", fs::file_size(b.tag_dir + "/rank0.bin") - 1);
  CHECK_THROWS_WITH(consolidate(b.root, out), Catch::Contains("rank0.bin") && Catch::Contains("truncated or replaced"));
  CHECK_FALSE(fs::exists(out));
  CHECK(leftovers(b.root).empty());
  fs::remove_all(b.root);
}

TEST_CASE("A bf16 checkpoint without fp32 masters is refused") {
  auto b = build("nomaster");
  Manifest m = b.manifest;
  m.dtype = "bf16", m.kinds = {"param"};
  for (auto& p : m.parameters) p.dtype = affine::DType::bf16;
  for (auto& s : m.maps) s.kind = "param";
  std::ofstream(b.tag_dir + "/" + kManifestName) << to_json(m);
  CHECK_THROWS_WITH(consolidate(b.root, b.root + "/out"), Catch::Contains("holds no fp32 masters"));
  fs::remove_all(b.root);
}

TEST_CASE("Shards as transformers cuts them") {
  // 40, 30, 50, 10 at 64: 40 | 30 (40+30 > 64) | 50 (30+50 > 64), 10 (60 <= 64).
  const auto shards = plan_shards({40, 30, 50, 10}, 64, "model", "safetensors");
  REQUIRE(shards.size() == 3);
  CHECK((shards[0].tensors == std::vector<size_t>{0}));
  CHECK((shards[2].tensors == std::vector<size_t>{2, 3}));
  CHECK(shards[2].bytes == 60);
  CHECK(shards[1].file == "model-00002-of-00003.safetensors");
  CHECK(plan_shards({40, 30}, 70, "model", "safetensors").front().file == "model.safetensors");
  const auto index = nlohmann::json::parse(shard_index_json(shards, {"w", "x", "y", "z"}, 130));
  CHECK(index["weight_map"]["z"] == "model-00003-of-00003.safetensors");
  CHECK(index["metadata"]["total_size"] == 130);
  CHECK_THROWS_WITH(plan_shards({1}, 0, "model", "bin"), Catch::Contains("positive"));
}
