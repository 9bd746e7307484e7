// The checkpoint format's pure parts: SaveLayout (which rank writes which elements, the maps of
// the files) against element-by-element reading of both sides, and the manifest's JSON round trip
// and refusals.
#include <catch2/catch.hpp>

#include <map>
#include <vector>

#include "core/affine/validate.h"
#include "core/affine/run_boxes.h"
#include "core/affine/zero_storage.h"
#include "core/checkpoint/hf_export.h"
#include "core/checkpoint/manifest.h"
#include "core/checkpoint/save_layout.h"
#include "core/error.h"

using namespace tessera;
using namespace tessera::checkpoint;
using affine::Box;
using affine::Dims;

namespace {

// A flat buffer over `world` ranks holding tensor (rows, cols) at `offset`, the same on every rank.
affine::TensorMap replicated_in_flat(const std::string& name, int64_t rows, int64_t cols, int64_t offset,
                                     int64_t buffer, int world) {
  affine::TensorMap m;
  m.name = name, m.dtype = affine::DType::f32, m.shape = Dims{rows, cols};
  std::vector<int> all;
  for (int r = 0; r < world; ++r) all.push_back(r);
  for (int r = 0; r < world; ++r) {
    auto& s = m.ranks[r];
    s.buffer_elements = buffer;
    s.pieces.push_back({Box(Dims{0, 0}, Dims{rows, cols}), offset, Dims{cols, 1}, all});
  }
  return m;
}

// Element (i, j) of `map` as the value stored at its address in `files` (file rank -> values).
std::vector<float> read_back(const affine::TensorMap& map, const std::map<int, std::vector<float>>& files) {
  std::vector<float> out(size_t(map.numel()), -1.0f);
  for (const auto& [rank, storage] : map.ranks)
    for (const auto& p : storage.pieces)
      for (int64_t i = p.box.origin[0]; i < p.box.end(0); ++i)
        for (int64_t j = p.box.origin[1]; j < p.box.end(1); ++j) {
          const float v = files.at(rank).at(size_t(p.address_of(Dims{i, j})));
          auto& slot = out[size_t(i * map.shape[1] + j)];
          CHECK((slot == -1.0f || slot == v));  // replicas agree
          slot = v;
        }
  return out;
}

}  // namespace

TEST_CASE("A replicated buffer is written in even slices, its maps cut at the slices' edges") {
  // "param/0" holds a (3, 4) weight at 0 and a (2, 3) weight at 12: 18 elements, 3 ranks -> 6 each.
  const int world = 3;
  std::vector<EngineMap> maps{{"param", "param/0", replicated_in_flat("a", 3, 4, 0, 18, world)},
                              {"param", "param/0", replicated_in_flat("b", 2, 3, 12, 18, world)}};
  SaveLayout layout(maps, world);
  REQUIRE(layout.replicated("param/0"));
  std::vector<float> buffer(18);
  for (int k = 0; k < 18; ++k) buffer[size_t(k)] = float(100 + k);
  std::vector<RankFile> files;
  std::map<int, std::vector<float>> contents;
  for (int r = 0; r < world; ++r) {
    const auto range = layout.written_range(r, "param/0", 18, {});
    REQUIRE(range);
    CHECK(range->second - range->first == 6);
    RankFile f;
    f.rank = r;
    f.buffers.push_back({"param/0", affine::DType::f32, range->second - range->first, 0, 1, {}});
    files.push_back(f);
    contents[r].assign(buffer.begin() + range->first, buffer.begin() + range->second);
  }
  const auto saved = layout.saved_maps(maps, {}, files);
  REQUIRE(saved.size() == 2);
  for (size_t t = 0; t < saved.size(); ++t) {
    INFO(saved[t].map.name);
    affine::validate_map(saved[t].map);
    // Every element reads back the value the engine's map gives it.
    std::map<int, std::vector<float>> engine{{0, buffer}};
    affine::TensorMap one = maps[t].map;
    one.ranks = {{0, one.ranks.at(0)}};
    CHECK(read_back(saved[t].map, contents) == read_back(one, engine));
  }
  // Weight "a" (elements 0-11) spans slices 0 and 1: rows cut between the files.
  CHECK(saved[0].map.ranks.count(0) == 1);
  CHECK(saved[0].map.ranks.count(1) == 1);
  CHECK(saved[0].map.ranks.count(2) == 0);
}

TEST_CASE("An alias lands where its base's bytes are written; a negative control reads wrong values") {
  // Stage-1-like: 2 ranks; "param/0" replicated (8 elements: a (2, 4) weight); "master/0" of rank r
  // is elements [4r, 4r + 4) of it (row r), an alias.
  const int world = 2;
  affine::TensorMap master;
  master.name = "w", master.dtype = affine::DType::f32, master.shape = Dims{2, 4};
  for (int r = 0; r < world; ++r) {
    master.ranks[r].buffer_elements = 4;
    master.ranks[r].pieces.push_back({Box(Dims{r, 0}, Dims{1, 4}), 0, Dims{4, 1}, {r}});
  }
  std::vector<EngineMap> maps{{"param", "param/0", replicated_in_flat("w", 2, 4, 0, 8, world)},
                              {"master", "master/0", master}};
  SaveLayout layout(maps, world);
  std::map<int, RankAliases> aliases{{0, {{"master/0", {"param/0", 0}}}}, {1, {{"master/0", {"param/0", 4}}}}};
  CHECK_FALSE(layout.written_range(1, "master/0", 4, aliases[1]));
  std::vector<RankFile> files;
  std::map<int, std::vector<float>> contents;
  const std::vector<float> weights{1, 2, 3, 4, 5, 6, 7, 8};
  for (int r = 0; r < world; ++r) {
    const auto range = *layout.written_range(r, "param/0", 8, aliases[r]);
    RankFile f;
    f.rank = r;
    f.buffers.push_back({"param/0", affine::DType::f32, range.second - range.first, 0, 1, {}});
    files.push_back(f);
    contents[r].assign(weights.begin() + range.first, weights.begin() + range.second);
  }
  const auto saved = layout.saved_maps(maps, aliases, files);
  CHECK(read_back(saved[1].map, contents) == weights);  // the masters are the weights
  // Negative control: without the alias offsets rank 1's master would read row 0.
  std::map<int, RankAliases> wrong{{0, {{"master/0", {"param/0", 0}}}}, {1, {{"master/0", {"param/0", 0}}}}};
  const auto bad = layout.saved_maps(maps, wrong, files);
  CHECK(read_back(bad[1].map, contents) != weights);
}

TEST_CASE("The manifest round-trips through JSON and refuses what is not one") {
  Manifest m;
  m.tag = "global_step7";
  m.world_size = 2, m.stage = 3;
  m.dtype = "bf16";
  m.parameters.push_back({"w", affine::DType::bf16, Dims{2, 4}});
  m.kinds = {"param", "master"};
  RankFile f;
  f.rank = 1, f.file = "rank1.safetensors", f.bytes = 100, f.hash = 0x0123456789abcdefULL;
  f.buffers.push_back({"param/0", affine::DType::bf16, 8, 64, 8, {1, 2}});
  m.files.push_back(f);
  m.engine.global_steps = 7, m.engine.group_lrs = {1e-3}, m.engine.last_lrs = {5e-4};
  m.engine.has_loss_scaler = true, m.engine.loss_scaler.scale = 1024;
  m.client_state = R"({"epoch":2})";
  const auto back = manifest_from_json(to_json(m), "test");
  CHECK(back.tag == m.tag);
  CHECK(back.files.at(0).hash == f.hash);
  CHECK(back.files.at(0).buffers.at(0).chunk_hashes == std::vector<uint64_t>{1, 2});
  CHECK(back.engine.loss_scaler.scale == 1024);
  CHECK(back.client_state == m.client_state);
  CHECK(to_json(back) == to_json(m));
  CHECK_THROWS_WITH(manifest_from_json("{}", "x.json"), Catch::Contains("x.json: not a valid checkpoint manifest at 'format'"));
  auto text = to_json(m);
  text.replace(text.find("rank1.safetensors"), 17, "../etc/passwd.xx");
  CHECK_THROWS_WITH(manifest_from_json(text, "x.json"), Catch::Contains("is not a plain name"));
  // A buffer that would reach past its file's end.
  f.buffers[0].data_offset = 95;
  m.files[0] = f;
  CHECK_THROWS_WITH(manifest_from_json(to_json(m), "x.json"), Catch::Contains("do not fit the file"));
}

// ---- The 16-bit export's layout and who writes what (hf_export.h), without an engine ----

namespace {

// Every rank's buffer holds, at each address, the element index it stores there (+ 1000 per
// tensor); applying every rank's writes to a file image must give each tensor's indices in order,
// every data byte written exactly once.
struct ExportImage {
  std::vector<std::vector<uint16_t>> files;
  std::vector<std::vector<int>> writes_per_element;
};

ExportImage simulate_export(const std::vector<tessera::affine::TensorMap>& maps, int world, int64_t max_shard_bytes) {
  using namespace tessera::checkpoint;
  std::vector<OutputTensor> tensors;
  for (const auto& m : maps) tensors.push_back({m.name, m.dtype, m.shape});
  const auto layout = plan_export(tensors, max_shard_bytes, {{"format", "pt"}});
  ExportImage image;
  for (const auto& f : layout.files) {
    image.files.emplace_back(size_t(f.bytes / 2), uint16_t(0xffff));
    image.writes_per_element.emplace_back(size_t(f.bytes / 2), 0);
  }
  for (size_t t = 0; t < maps.size(); ++t)
    for (int rank = 0; rank < world; ++rank) {
      if (!maps[t].ranks.count(rank)) continue;
      const auto& storage = maps[t].ranks.at(rank);
      std::vector<uint16_t> buffer(size_t(storage.buffer_elements), uint16_t(0xeeee));
      for (const auto& piece : storage.pieces)
        for (int64_t i = 0; i < piece.box.volume(); ++i) {  // the box's elements, row-major
          tessera::affine::Dims index = piece.box.origin;
          int64_t rest = i;
          for (int k = piece.box.ndim() - 1; k >= 0; --k)
            index[k] = piece.box.origin[k] + rest % piece.box.shape[k], rest /= piece.box.shape[k];
          buffer[size_t(piece.address_of(index))] =
              uint16_t(1000 * t + tessera::affine::linear_index(maps[t].shape, index));
        }
      for (const auto& w : export_writes(maps[t], layout, layout.file_of[t], layout.offset_of[t], rank, world)) {
        REQUIRE(w.bytes % 2 == 0);
        for (int64_t b = 0; b < w.bytes / 2; ++b) {
          image.files[size_t(w.file)][size_t(w.file_offset / 2 + b)] = buffer[size_t(w.buffer_offset / 2 + b)];
          ++image.writes_per_element[size_t(w.file)][size_t(w.file_offset / 2 + b)];
        }
      }
    }
  for (size_t t = 0; t < maps.size(); ++t)
    for (int64_t e = 0; e < maps[t].numel(); ++e) {
      const auto at = size_t(layout.offset_of[t] / 2 + e);
      INFO(maps[t].name << " element " << e);
      CHECK(image.writes_per_element[size_t(layout.file_of[t])][at] == 1);
      CHECK(image.files[size_t(layout.file_of[t])][at] == uint16_t(1000 * t + e));
    }
  return image;
}

std::vector<tessera::affine::TensorMap> export_maps(int world) {
  using namespace tessera::affine;
  std::vector<TensorMap> maps;
  // A ZeRO-3 partition (uneven at 3 ranks: 70 elements, P = 24) and a replicated vector.
  maps.push_back(zero3_partition({"w", DType::bf16, Dims{10, 7}}, world));
  std::vector<StoredRun> runs;
  std::map<int, int64_t> sizes;
  for (int r = 0; r < world; ++r) runs.push_back({r, 0, 3000, 5}), sizes[r] = 3005;
  maps.push_back(stored_runs({"b", DType::bf16, Dims{3000}}, runs, sizes));
  maps.push_back(zero3_partition({"v", DType::bf16, Dims{5}}, world));
  return maps;
}

}  // namespace

TEST_CASE("The export's writes cover every byte once: partitions by their holder, replicas split by slices",
          "[format][export]") {
  for (int world : {1, 2, 3}) {
    for (int64_t max_shard : {int64_t(100), int64_t(1) << 30}) {
      INFO("world " << world << ", shards of at most " << max_shard << " bytes");
      simulate_export(export_maps(world), world, max_shard);
    }
  }
  // Replicated bytes are shared: at 3 ranks no rank writes all of the 6000-byte vector.
  using namespace tessera::checkpoint;
  const auto maps = export_maps(3);
  std::vector<OutputTensor> tensors;
  for (const auto& m : maps) tensors.push_back({m.name, m.dtype, m.shape});
  const auto layout = plan_export(tensors, int64_t(1) << 30, {});
  REQUIRE(layout.files.size() == 1);
  CHECK(layout.index_json.empty());
  for (int rank = 0; rank < 3; ++rank) {
    int64_t bytes = 0;
    for (const auto& w : export_writes(maps[1], layout, 0, layout.offset_of[1], rank, 3)) bytes += w.bytes;
    CHECK(bytes < 6000);
  }
}

TEST_CASE("The export check finds a rank's missing piece (negative control)", "[format][export]") {
  auto maps = export_maps(3);
  maps[0].ranks.at(1).pieces.pop_back();  // rank 1 no longer stores its last run of "w"
  std::vector<tessera::checkpoint::OutputTensor> tensors;
  for (const auto& m : maps) tensors.push_back({m.name, m.dtype, m.shape});
  const auto layout = tessera::checkpoint::plan_export(tensors, int64_t(1) << 30, {});
  int64_t written = 0;
  for (int rank = 0; rank < 3; ++rank)
    for (const auto& w : tessera::checkpoint::export_writes(maps[0], layout, 0, layout.offset_of[0], rank, 3))
      written += w.bytes;
  CHECK(written < 70 * 2);
}
