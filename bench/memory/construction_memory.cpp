// construction_memory: what building a model costs in memory, plainly and inside ZeRO-3's
// PartitionedConstruction scope (core/zero/partitioned_construction.h), counted by an allocator
// that sees every CPU tensor (bench/common/counting_allocator.h). One process plays rank 0 of W.
//   build/bench/memory/construction_memory [--layers 8] [--width 2048] [--world 2 4 8]
// JSON lines: the peak and the live bytes after construction, each as a ratio to plain
// construction measured in the same run (the baseline).
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cstdio>
#include <vector>

#include "bench/common/counting_allocator.h"
#include "core/zero/partitioned_construction.h"
#include "core/zero/unit_holder.h"

namespace {

using tessera::bench::g_live;
using tessera::bench::g_peak;

// Layers of Linear(width, width), LibTorch's initialisation in the constructors.
struct StackImpl : torch::nn::Module {
  StackImpl(int layers, int64_t width) {
    for (int i = 0; i < layers; ++i)
      this->layers.push_back(register_module("l" + std::to_string(i), torch::nn::Linear(width, width)));
  }
  std::vector<tessera::Unit<torch::nn::Linear>> layers;
};

struct Cost {
  double peak_mb = 0, live_mb = 0;
};

Cost build(int layers, int64_t width, int world) {
  const int64_t base = g_live.load();
  tessera::bench::reset_peak();
  std::shared_ptr<StackImpl> model;
  {
    torch::manual_seed(1);
    std::unique_ptr<tessera::zero::PartitionedConstruction> scope;
    if (world > 0) scope = std::make_unique<tessera::zero::PartitionedConstruction>(world, 0);
    model = std::make_shared<StackImpl>(layers, width);
  }
  Cost c{double(g_peak.load() - base) / (1 << 20), double(g_live.load() - base) / (1 << 20)};
  for (const auto& p : model->parameters()) tessera::zero::forget_constructed(p);
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  int layers = 8;
  int64_t width = 2048;
  std::vector<int> worlds = {2, 4, 8};
  CLI::App app{"memory of plain and partitioned construction"};
  app.add_option("--layers", layers);
  app.add_option("--width", width);
  app.add_option("--world", worlds);
  CLI11_PARSE(app, argc, argv);
  static tessera::bench::CountingAllocator counting;
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  const auto plain = build(layers, width, 0);
  const double model_mb = double(layers) * double(width * width + width) * 4 / (1 << 20);
  std::printf("{\"bench\":\"construction_memory\",\"mode\":\"plain\",\"model_mb\":%.2f,\"peak_mb\":%.2f,\"live_mb\":%.2f}\n",
              model_mb, plain.peak_mb, plain.live_mb);
  for (int w : worlds) {
    const auto cut = build(layers, width, w);
    std::printf("{\"bench\":\"construction_memory\",\"mode\":\"partitioned\",\"world\":%d,\"model_mb\":%.2f,\"peak_mb\":%.2f,"
                "\"live_mb\":%.2f,\"peak_ratio_to_plain\":%.3f,\"live_ratio_to_plain\":%.3f}\n",
                w, model_mb, cut.peak_mb, cut.live_mb, cut.peak_mb / plain.peak_mb, cut.live_mb / plain.live_mb);
  }
  return 0;
}
