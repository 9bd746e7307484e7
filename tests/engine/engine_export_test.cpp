// Engine::save_16bit_model at stages 0-3 in fp32 and bf16: every tensor of the export equals the
// gathered weights bitwise (gathered_parameters() is the oracle), though no rank gathered anything
// to write it. The files start NaN-filled (ExportFill::nan_bytes), so a byte no rank wrote fails.
// Sharded exports carry Hugging Face's index; a re-export into the same directory removes the
// shards it no longer has; frozen parameters are exported unless excluded.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "actors/engine/engine.h"
#include "core/config/load.h"
#include "core/io/weight_directory.h"
#include "core/nn/tiny_gpt.h"
#include "tests/engine/engine_test_support.h"

namespace fs = std::filesystem;

namespace {

using namespace tessera::engine_testing;

std::string job_dir(const std::string& name) {
  const char* job = std::getenv("TESSERA_JOB");
  return (fs::temp_directory_path() / ("tessera_export_" + std::string(job ? job : "solo") + "_" + name)).string();
}

std::string config(int stage, bool bf16) {
  return "train_micro_batch_size_per_gpu = " + std::to_string(8 / kWorld) +
         "\ngradient_accumulation_steps = 1\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nreduce_bucket_size = 5000\nstage3_param_persistence_threshold = 100\n" +
         (bf16 ? "[bf16]\nenabled = true\n" : "") + "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

struct Trained {
  std::unique_ptr<tessera::nn::TinyGpt> model;
  std::shared_ptr<tessera::Engine> engine;
};

Trained train(int stage, bool bf16, const std::string& frozen = "") {
  Trained t;
  t.model = std::make_unique<tessera::nn::TinyGpt>(small_gpt_config(7));
  if (!frozen.empty()) t.model->module()->named_parameters()[frozen].set_requires_grad(false);
  t.engine = tessera::initialize(t.model->module(), tessera::config::load_config_text(config(stage, bf16),
                                                                                     tessera::config::Format::toml, "export"))
                 .engine;
  for (int step = 0; step < 2; ++step) {
    auto batch = corpus().batch(5, step, 0, 8, 16, kRank, kWorld);
    t.engine->backward(t.model->loss(batch.tokens, batch.targets));
    t.engine->step();
  }
  return t;
}

// The module's weights as the engine holds them (gathered at stage 3), in model order.
std::vector<std::pair<std::string, torch::Tensor>> gathered(const Trained& t) {
  auto scope = t.engine->gathered_parameters();
  std::vector<std::pair<std::string, torch::Tensor>> out;
  std::set<const c10::TensorImpl*> seen;  // a tied tensor once, under its first name
  for (const auto& item : t.model->module()->named_parameters())
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

// Names whose tensor in `dir` is missing or not bitwise equal (dtype included) to the oracle's.
std::vector<std::string> differing(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& oracle) {
  tessera::io::WeightDirectory files(dir);
  std::vector<std::string> out;
  for (const auto& [name, expected] : oracle) {
    if (!files.contains(name)) {
      out.push_back(name + " (missing)");
      continue;
    }
    const auto got = files.read(name);
    if (got.scalar_type() != expected.scalar_type() || !got.equal(expected)) out.push_back(name);
  }
  if (files.names().size() != oracle.size()) out.push_back("extra tensors: " + std::to_string(files.names().size()));
  return out;
}

// The directory's file names; without hidden ones unless `hidden` (an export removes the files it
// replaced in the background, hidden meanwhile).
std::vector<std::string> listing(const std::string& dir, bool hidden = false) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (hidden || e.path().filename().string()[0] != '.') names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("save_16bit_model writes the gathered weights bitwise at every stage, each rank its own bytes", "[export]") {
  for (const bool bf16 : {false, true})
    for (int stage = 0; stage <= 3; ++stage) {
      DYNAMIC_SECTION((bf16 ? "bf16" : "fp32") << " stage " << stage) {
        auto t = train(stage, bf16);
        const auto dir = job_dir("s" + std::to_string(stage) + (bf16 ? "b" : "f"));
        if (kRank == 0) fs::remove_all(dir);
        tessera::Save16BitOptions options;
        options.max_shard_bytes = 40000;  // several shards, tensors cut between ranks' slices
        options.fill_for_testing = tessera::checkpoint::ExportFill::nan_bytes;
        options.config_json = "{\"model_type\": \"test\"}";
        const auto written = t.engine->save_16bit_model(dir, options);
        const auto oracle = gathered(t);
        CHECK(differing(dir, oracle).empty());
        INFO(differing(dir, oracle).size());
        REQUIRE(written.files.size() >= 4);  // shards, index, config.json
        CHECK(written.files[written.files.size() - 2] == "model.safetensors.index.json");
        CHECK(listing(dir).size() == written.files.size());  // no temporary file left
        // Each rank wrote its share, about 1/W of the bytes (no rank gathered the model).
        int64_t total = 0;
        for (const auto& [name, p] : oracle) total += p.numel() * p.element_size();
        CHECK(written.bytes_written <= total / kWorld + total / 50 + 8192 * int64_t(written.files.size()));
        if (kWorld == 1) CHECK(written.bytes_written == total);
      }
    }
}

TEST_CASE("A re-export replaces the earlier one's files; frozen parameters are exported unless excluded", "[export]") {
  auto t = train(3, false, "h.0.ln_1.weight");
  const auto dir = job_dir("again");
  if (kRank == 0) fs::remove_all(dir);
  tessera::Save16BitOptions sharded;
  sharded.max_shard_bytes = 40000;
  t.engine->save_16bit_model(dir, sharded);
  const auto oracle = gathered(t);
  CHECK(differing(dir, oracle).empty());
  tessera::Save16BitOptions whole;
  whole.exclude_frozen_parameters = true;
  const auto written = t.engine->save_16bit_model(dir, whole);
  CHECK(written.files == std::vector<std::string>{"model.safetensors"});
  CHECK(listing(dir) == std::vector<std::string>{"model.safetensors"});  // the shards and index are gone
  tessera::io::WeightDirectory files(dir);
  CHECK_FALSE(files.contains("h.0.ln_1.weight"));
  CHECK(files.names().size() == oracle.size() - 1);
  t.engine.reset();  // waits for rank 0's removal of the replaced files
  if (kRank == 0) CHECK(listing(dir, true) == std::vector<std::string>{"model.safetensors"});
}

TEST_CASE("The export check fails on one flipped element (negative control)", "[export]") {
  auto t = train(2, true);
  const auto dir = job_dir("control");
  if (kRank == 0) fs::remove_all(dir);
  t.engine->save_16bit_model(dir);
  const auto oracle = gathered(t);
  REQUIRE(differing(dir, oracle).empty());
  // Every rank corrupts its own copy, so no rank reads a file another is changing.
  const auto copy = dir + "_rank" + std::to_string(kRank);
  fs::remove_all(copy);
  fs::copy(dir, copy);
  {
    std::fstream f(copy + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-2, std::ios::end);
    f.put(char(0xff)), f.put(char(0xff));
  }
  const auto bad = differing(copy, oracle);
  CHECK(bad.size() == 1);
  fs::remove_all(copy);
}
