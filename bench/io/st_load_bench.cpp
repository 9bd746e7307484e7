// st_load_bench: how close loading a safetensors weight directory comes to the raw read speed of
// the same file, with the file in the page cache. Writes a GPT-shaped model.safetensors of --mib
// MiB (bf16 matrices, f32 norms, one i64 scalar), validates a read-back bitwise, then reports the
// best of --repeats interleaved runs (after one warm-up) of three modes, one JSON line each, with
// ratio_to_raw_read = the mode's GiB/s over raw_pread's:
//   raw_pread  one pread loop of the whole file into one preallocated buffer (the baseline)
//   read_into  WeightDirectory open + read_into of every tensor into preallocated tensors
//   read       WeightDirectory open + read() of every tensor (allocates each run)
//   build/bench/io/st_load_bench --mib 256
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <unistd.h>

#include "core/io/detail/posix_file.h"
#include "core/io/weight_directory.h"
#include "bench/common/commit.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best wall time of each run over `repeats` interleaved rounds (so drift on a shared machine hits
// every mode alike), after one warm-up round (page cache, allocator, first touch).
std::vector<double> best_seconds(const std::vector<std::function<void()>>& runs, int repeats) {
  for (const auto& run : runs) run();
  std::vector<double> best(runs.size(), 1e300);
  for (int i = 0; i < repeats; ++i) {
    for (size_t k = 0; k < runs.size(); ++k) {
      const auto start = Clock::now();
      runs[k]();
      best[k] = std::min(best[k], std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  return best;
}

using tessera::bench::commit;

// GPT-2 shaped tensors of d_model `d` until `target_bytes` (the last matrix trimmed to fit).
std::vector<std::pair<std::string, at::Tensor>> model_tensors(uint64_t target_bytes, int64_t d) {
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  uint64_t total = 0;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, at::ScalarType type) {
    const uint64_t row_bytes = uint64_t(cols) * c10::elementSize(type);
    rows = std::min<int64_t>(rows, int64_t((target_bytes - total) / row_bytes));
    if (rows <= 0) return false;
    at::Tensor t = rows == 1 && type == at::kFloat ? torch::ones({cols}) : torch::randn({rows, cols}).to(type);
    total += uint64_t(t.nbytes());
    tensors.emplace_back(name, t);
    return true;
  };
  tensors.emplace_back("step", torch::scalar_tensor(int64_t(1000), at::kLong));
  total += 8;
  if (!add("wte.weight", 16384, d, at::kBFloat16)) return tensors;
  for (int layer = 0;; ++layer) {
    const std::string h = "h." + std::to_string(layer) + ".";
    if (!add(h + "ln_1.weight", 1, d, at::kFloat) || !add(h + "attn.c_attn.weight", 3 * d, d, at::kBFloat16) ||
        !add(h + "attn.c_proj.weight", d, d, at::kBFloat16) || !add(h + "ln_2.weight", 1, d, at::kFloat) ||
        !add(h + "mlp.c_fc.weight", 4 * d, d, at::kBFloat16) || !add(h + "mlp.c_proj.weight", d, 4 * d, at::kBFloat16))
      return tensors;
  }
}

bool bitwise_equal(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().reshape({-1}).view(at::kByte), b.contiguous().reshape({-1}).view(at::kByte));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"safetensors load speed against a raw pread of the same file (page cache)"};
  int64_t mib = 256, d_model = 1024;
  int repeats = 5;
  std::string dir = (std::filesystem::temp_directory_path() / ("tessera_st_bench_" + std::to_string(::getpid()))).string();
  bool keep = false;
  app.add_option("--mib", mib, "size of the weights in MiB")->check(CLI::PositiveNumber);
  app.add_option("--d-model", d_model, "model width of the generated tensors")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "timed runs per mode (best reported)")->check(CLI::PositiveNumber);
  app.add_option("--dir", dir, "weight directory to write (removed at the end unless --keep)");
  app.add_flag("--keep", keep, "keep the weight directory");
  CLI11_PARSE(app, argc, argv);

  std::vector<std::pair<std::string, at::Tensor>> tensors = model_tensors(uint64_t(mib) << 20, d_model);
  tessera::io::save_weight_directory(dir, tensors);
  const std::string file = (std::filesystem::path(dir) / "model.safetensors").string();
  const uint64_t file_bytes = std::filesystem::file_size(file);

  // Preallocated once, reused by every run (the steady state allocates nothing big).
  at::Tensor raw = at::empty({int64_t(file_bytes)}, at::kByte);
  std::vector<std::pair<std::string, at::Tensor>> destinations;
  for (const auto& [name, tensor] : tensors) destinations.emplace_back(name, at::empty_like(tensor));
  raw.fill_(0);
  for (auto& [name, tensor] : destinations) tensor.zero_();  // first touch outside the timing

  const auto read_raw = [&] {
    tessera::io::detail::ReadOnlyFile f(file);
    f.pread_exact(raw.data_ptr(), file_bytes, 0, "the whole file");
  };
  const auto read_into = [&] {
    const tessera::io::WeightDirectory weights(dir);
    for (auto& [name, tensor] : destinations) weights.read_into(name, tensor);
  };
  const auto read_new = [&] {
    const tessera::io::WeightDirectory weights(dir);
    std::vector<at::Tensor> out;
    out.reserve(tensors.size());
    for (const auto& [name, tensor] : tensors) out.push_back(weights.read(name));
  };

  // Validate before timing: both read paths give the written bytes.
  read_into();
  const tessera::io::WeightDirectory check(dir);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!bitwise_equal(destinations[i].second, tensors[i].second) ||
        !bitwise_equal(check.read(tensors[i].first), tensors[i].second)) {
      std::fprintf(stderr, "st_load_bench: tensor '%s' read back differs\n", tensors[i].first.c_str());
      return 1;
    }
  }
  int64_t data_elements = 0;
  for (auto& [name, tensor] : tensors) {
    data_elements += tensor.numel();
    tensor = at::Tensor();  // the originals are not needed any more
  }

  const std::vector<double> best = best_seconds({read_raw, read_into, read_new}, repeats);
  const double raw_s = best[0];
  const std::string sha = commit();
  auto line = [&](const char* mode, double seconds) {
    std::printf("{\"bench\":\"safetensors_load\",\"mode\":\"%s\",\"mib\":%lld,\"file_bytes\":%llu,\"tensors\":%zu,"
                "\"elements\":%lld,\"repeats\":%d,\"best_ms\":%.3f,\"gib_per_s\":%.3f,\"ratio_to_raw_read\":%.3f,"
                "\"commit\":\"%s\"}\n",
                mode, static_cast<long long>(mib), static_cast<unsigned long long>(file_bytes), destinations.size(),
                static_cast<long long>(data_elements), repeats, seconds * 1e3,
                double(file_bytes) / double(1 << 30) / seconds, raw_s / seconds, sha.c_str());
  };
  line("raw_pread", best[0]);
  line("read_into", best[1]);
  line("read", best[2]);
  std::fflush(stdout);
  if (!keep) std::filesystem::remove_all(dir);
  return 0;
}
