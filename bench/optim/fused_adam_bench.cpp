// fused_adam_bench: the fused CPU Adam kernel (core/optim/fused_adam.h) on one thread, against
// LibTorch's torch::optim::Adam on one thread and the memory bound, all measured in this run on
// fp32 tensors far beyond the last-level cache (default 32 M parameters: 4 x 128 MiB).
//   memory bound   a streaming pass reading 16 B and writing 12 B per parameter (p, g, m, v in;
//                  p, m, v out), the least any Adam over these buffers can move
//   libtorch_adam  torch::optim::Adam::step() (no decay); its temporaries are allocated each step,
//                  and with glibc's defaults a buffer this large is mmapped and unmapped each time,
//                  so every step pays page faults: measured as it comes, then again with
//                  mallopt(M_MMAP_THRESHOLD, M_TRIM_THRESHOLD) keeping freed memory for reuse
//   optimizer_kernel  tessera's ATen-op kernel (OptimizerKernel: workspace reused, no faults)
//   fused_<path>   every SIMD path this CPU has; also with the bf16 copy of the parameters
// One JSON line per measurement: parameters per second (median of --repeats passes), the ratio
// to LibTorch's Adam (without the mallopt, as users run it) and to the memory bound.
//   build/bench/optim/fused_adam_bench [--params N] [--repeats R]
#include <CLI/CLI.hpp>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/optim/fused_adam.h"
#include "core/optim/optimizer_kernel.h"

namespace optim = tessera::optim;

namespace {

double median_seconds(int repeats, const std::function<void()>& pass) {
  std::vector<double> s;
  pass();  // warm: first-touch faults and caches out of the figure
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

// Reads p, g, m, v and writes p, m, v once: 28 B per element, no arithmetic to speak of.
// (restrict: the buffers are distinct, so the loop vectorises; target_clones: with the widest
// vectors this CPU has, as the fused kernel's best path uses; the build's baseline is SSE2, whose
// pass was slower than the AVX-512 kernel here, so it was no bound.)
__attribute__((noinline, target_clones("avx512f", "avx2", "default"))) void stream_pass(float* __restrict__ p, const float* __restrict__ g, float* __restrict__ m,
                                           float* __restrict__ v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    p[i] += gi, m[i] += gi, v[i] += gi;
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fused CPU Adam vs LibTorch's Adam and the memory bound, one thread"};
  int64_t n = int64_t(32) << 20;
  int repeats = 5;
  app.add_option("--params", n, "parameters per tensor");
  app.add_option("--repeats", repeats, "timed passes per measurement (median)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  torch::manual_seed(0);
  auto p = torch::randn({n}), g = torch::randn({n}) * 1e-3, m = torch::zeros({n}), v = torch::zeros({n});
  auto bf16 = torch::empty({n}, torch::kInt16);
  const double mib = double(n) * 28 / (1 << 20);

  const double bound_s = median_seconds(repeats, [&] {
    stream_pass(p.data_ptr<float>(), g.data_ptr<float>(), m.data_ptr<float>(), v.data_ptr<float>(), n);
  });
  auto line = [&](const std::string& what, double seconds, double libtorch_s, const std::string& extra = "") {
    std::printf("{\"bench\": \"fused_adam\", \"what\": \"%s\", \"params\": %lld, \"threads\": 1, \"ms\": %.3f, "
                "\"gparams_per_s\": %.4f, \"ratio_to_libtorch_adam\": %.3f, \"ratio_to_memory_bound\": %.3f%s}\n",
                what.c_str(), (long long)n, seconds * 1e3, double(n) / seconds / 1e9, libtorch_s / seconds, bound_s / seconds,
                extra.c_str());
    std::fflush(stdout);
  };
  std::printf("{\"bench\": \"fused_adam\", \"what\": \"memory_bound\", \"params\": %lld, \"ms\": %.3f, \"gib_per_s\": %.3f}\n",
              (long long)n, bound_s * 1e3, mib / 1024 / bound_s);

  // LibTorch's Adam, as it comes and then with freed memory kept for reuse.
  auto param = p.clone().requires_grad_(true);
  param.mutable_grad() = g.clone();
  torch::optim::Adam adam({param}, torch::optim::AdamOptions(1e-3));
  const double libtorch_s = median_seconds(repeats, [&] { adam.step(); });
  line("libtorch_adam", libtorch_s, libtorch_s, ", \"allocator\": \"glibc defaults\"");
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const double libtorch_kept_s = median_seconds(repeats, [&] { adam.step(); });
  line("libtorch_adam", libtorch_kept_s, libtorch_s, ", \"allocator\": \"mallopt: no mmap, no trim\"");

  optim::OptimizerOptions o;
  o.kind = optim::OptimizerKind::Adam;
  const auto kernel = optim::make_optimizer_kernel(o);
  optim::Workspace ws;
  int64_t kernel_step = 0;
  line("optimizer_kernel",
       median_seconds(repeats, [&] { kernel->step(p, g, {m, v}, ++kernel_step, kernel->default_hyperparameters(), ws); }),
       libtorch_s);

  for (auto path : {optim::SimdPath::scalar, optim::SimdPath::avx2, optim::SimdPath::avx512}) {
    if (!optim::simd_path_available(path)) continue;
    for (bool with_bf16 : {false, true}) {
      optim::FusedAdamRun run;
      run.param = p.data_ptr<float>(), run.grad = g.data_ptr<float>();
      run.exp_avg = m.data_ptr<float>(), run.exp_avg_sq = v.data_ptr<float>(), run.elements = n;
      run.param_bf16 = with_bf16 ? reinterpret_cast<uint16_t*>(bf16.data_ptr()) : nullptr;
      optim::FusedAdamStep step;
      step.step = 0;
      const double s = median_seconds(repeats, [&] {
        ++step.step;
        optim::fused_adam(run, step, path);
      });
      line(std::string("fused_") + optim::to_string(path) + (with_bf16 ? "_bf16_copy" : ""), s, libtorch_s);
    }
  }
  return 0;
}
