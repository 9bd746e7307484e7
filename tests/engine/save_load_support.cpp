// What the checkpoint tests share (save_load_support.h).
#include "tests/engine/save_load_support.h"

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <limits>
#include <thread>

#include "core/config/load.h"
#include "tests/engine/storage_snapshot.h"
#include "tests/engine/test_communicator.h"
#include "transport/communicator.h"

namespace fs = std::filesystem;

namespace tessera::save_load_testing {

tessera::transport::Communicator& test_comm() { return test_communicator("save_load_test"); }
void barrier() {
  if (kWorld > 1) test_comm().barrier()->wait();
}

// A directory every rank of this launch names alike, emptied by rank 0 (before a collective call).
std::string fresh_dir(const std::string& name) {
  const auto dir = fs::temp_directory_path() / ("tessera_save_load_" + engine_testing::env_string("TESSERA_JOB", "solo") + "_" + name);
  if (kRank == 0) fs::remove_all(dir);
  barrier();
  return dir.string();
}

namespace {

// fp16 matrix kernels do not exist on CPU in LibTorch 1.13: fp16 weights, fp32 compute.
struct UpcastMlp : torch::nn::Module {
  UpcastMlp() {
    torch::manual_seed(5);
    w1 = register_parameter("w1", torch::randn({16, 8}) * 0.3);
    b1 = register_parameter("b1", torch::zeros({16}));
    w2 = register_parameter("w2", torch::randn({1, 16}) * 0.3);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = torch::tanh(torch::nn::functional::linear(x, w1.to(torch::kFloat), b1.to(torch::kFloat)));
    return torch::nn::functional::linear(h, w2.to(torch::kFloat));
  }
  torch::Tensor w1, b1, w2;
};

}  // namespace

Trainee gpt(uint64_t seed) {
  tessera::nn::GptConfig c;
  c.d_model = 32, c.n_layer = 2, c.n_head = 2, c.context = 16, c.seed = seed;
  auto model = std::make_shared<tessera::nn::TinyGpt>(c);
  return {model->module(), [model](int step, int micro) {
            auto batch = corpus().batch(3, step, micro, kGlobalBatch, 16, kRank, kWorld);
            return model->loss(batch.tokens, batch.targets);
          }};
}

// Step 1 overflows on rank 0 in fp16: skipped on every rank.
Trainee mlp() {
  auto model = std::make_shared<UpcastMlp>();
  return {model, [model](int step, int micro) {
            auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 * step + 10 * micro + kRank);
            auto x = at::randn({8, 8}, gen);
            auto loss = (model->forward(x) - torch::sin(x.sum(1, true))).pow(2).mean();
            return step == 1 && kRank == 0 ? loss * 1e30 : loss;
          }};
}

std::string config(int stage, const std::string& precision) {
  return "train_micro_batch_size_per_gpu = " + std::to_string(kGlobalBatch / kWorld) +
         "\ngradient_accumulation_steps = 2\n" + precision +
         "[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 3e-3\nweight_decay = 0.01\n"
         "[scheduler]\ntype = \"WarmupLR\"\n[scheduler.params]\nwarmup_min_lr = 0\nwarmup_max_lr = 3e-3\nwarmup_num_steps = 4\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nreduce_bucket_size = 3000\nstage3_param_persistence_threshold = 100\n"
         "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

std::shared_ptr<Engine> engine_for(const Trainee& t, const std::string& toml) {
  return tessera::initialize(t.module, tessera::config::load_config_text(toml, tessera::config::Format::toml, "save_load"))
      .engine;
}

void train(Engine& engine, const Trainee& t, int from, int to) {
  for (int step = from; step < to; ++step)
    for (int micro = 0; micro < 2; ++micro) {
      engine.backward(t.loss(step, micro));
      engine.step();
    }
}

void fill_nan(Engine& engine) {
  torch::NoGradGuard no_grad;
  for (auto& [key, t] : engine.storage_maps().buffers) t.fill_(std::numeric_limits<double>::quiet_NaN());
}

Counters counters(const Engine& e) {
  return {e.global_steps(), e.micro_steps(), e.skipped_steps(), e.loss_scale(), e.get_lr(), e.last_lrs()};
}

void exact_resume(const std::string& name, const std::function<Trainee()>& make, const std::string& toml,
                  tessera::SaveMode mode) {
  INFO(name);
  const auto dir = fresh_dir(name);
  auto first = make();
  auto engine = engine_for(first, toml);
  train(*engine, first, 0, 3);
  const auto at_save = buffers(*engine);
  const auto counters_at_save = counters(*engine);
  tessera::CheckpointSaveOptions save{"", R"({"epoch": 7, "seen": [1, 2]})"};
  save.mode = mode;
  if (mode == tessera::SaveMode::asynchronous)  // the next steps run while the snapshot is pending
    save.at_point_for_testing = [](tessera::SavePoint p) {
      if (p == tessera::SavePoint::snapshot_begins) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    };
  const auto path = engine->save_checkpoint(dir, save);
  CHECK(path == (fs::path(dir) / "global_step3").string());
  train(*engine, first, 3, 5);
  engine->wait_for_checkpoint();
  const auto at_end = buffers(*engine);
  const auto counters_at_end = counters(*engine);

  auto second = make();
  auto resumed = engine_for(second, toml);
  fill_nan(*resumed);
  // Negative control: the comparison sees buffers that were not overwritten.
  CHECK_FALSE(differing(at_save, buffers(*resumed)).empty());
  const auto loaded = resumed->load_checkpoint(dir);
  CHECK(loaded.tag == "global_step3");
  CHECK(loaded.client_state == R"({"epoch":7,"seen":[1,2]})");
  const auto after_load = differing(at_save, buffers(*resumed));
  INFO("buffers that differ after the load: " << after_load.size() << (after_load.empty() ? "" : " first " + after_load.front()));
  CHECK(after_load.empty());
  CHECK(counters(*resumed) == counters_at_save);
  train(*resumed, second, 3, 5);
  const auto diff = differing(at_end, buffers(*resumed));
  INFO("buffers that differ after 2 more steps: " << diff.size() << (diff.empty() ? "" : " first " + diff.front()));
  CHECK(diff.empty());
  CHECK(counters(*resumed) == counters_at_end);
}

std::map<std::string, torch::Tensor> materialize(const Engine& engine) {
  const auto storage = engine.storage_maps();
  std::map<std::string, std::vector<torch::Tensor>> all;  // buffer key -> every rank's copy
  for (const auto& [key, t] : storage.buffers) {
    auto flat = t.reshape({t.numel()}).contiguous();
    if (kWorld == 1) {
      all[key] = {flat};
      continue;
    }
    auto gathered = torch::empty({kWorld * flat.numel()}, flat.options());
    test_comm().all_gather(flat, gathered)->wait();
    for (int r = 0; r < kWorld; ++r) all[key].push_back(gathered.narrow(0, r * flat.numel(), flat.numel()));
  }
  std::map<std::string, torch::Tensor> out;
  for (const auto& m : storage.maps) {
    const auto& some = all.at(m.buffer).front();
    auto full = torch::full({m.map.numel()}, std::numeric_limits<double>::quiet_NaN(), some.options());
    const int64_t es = int64_t(some.element_size());
    auto* dst = static_cast<char*>(full.data_ptr());
    for (const auto& [rank, storage_of_rank] : m.map.ranks) {
      const auto* src = static_cast<const char*>(all.at(m.buffer).at(size_t(rank)).data_ptr());
      for (const auto& piece : storage_of_rank.pieces) {
        const auto& box = piece.box;
        if (box.is_empty()) continue;
        tessera::affine::Dims i = box.origin;
        for (;;) {
          int64_t linear = 0;
          for (int k = 0; k < m.map.shape.size(); ++k) linear = linear * m.map.shape[k] + i[k];
          std::memcpy(dst + linear * es, src + piece.address_of(i) * es, size_t(es));
          int k = box.ndim() - 1;
          while (k >= 0 && ++i[k] == box.end(k)) i[k] = box.origin[k], --k;
          if (k < 0) break;
        }
      }
    }
    out[m.kind + "/" + m.map.name] = full;
  }
  return out;
}

std::map<std::string, torch::Tensor> gathered_weights(const Engine& engine) {
  std::map<std::string, torch::Tensor> out;
  engine.for_each_gathered_parameter([&](const std::string& name, const at::Tensor& w) { out["gathered/" + name] = w.clone(); });
  return out;
}

std::string precision_section(const std::string& dtype) {
  if (dtype == "bf16") return "[bf16]\nenabled = true\n";
  return "";
}

}  // namespace tessera::save_load_testing
