// checkpoint_bench: save and load throughput per rank as a ratio to raw sequential I/O of the same
// bytes on the same disk, in the same run. Run under tessera-launch (every rank measures its own):
//   tools/tessera-launch --nproc-per-node 2 build/bench/checkpoint/checkpoint_bench --mib 512 --dir /var/tmp/ckb
// A model of --mib MiB of fp32 weights (an MLP of width --width) trains one AdamW step at --stage,
// then, --repeats rounds (medians reported):
//   raw_write  this rank's checkpoint file's bytes written sequentially from memory + fsync
//   save       Engine::save_checkpoint (XXH3 of every chunk and file, fsync, commit)
//   raw_read   that raw file read sequentially after dropping its pages (posix_fadvise DONTNEED on
//              clean, synced pages: the disk is measured, not memory)
//   load       Engine::load_checkpoint at the same layout after dropping the checkpoint's pages
//   raw_read_as_much  as many bytes as that load read, read sequentially from this rank's files (its
//              rank file, then the raw write's copy); load_as_much: the load against it
//   async_save_blocked  an asynchronous save followed by one training step (forward, backward and
//              step() on --batch rows): the time training is blocked, i.e. save_checkpoint's own time
//              plus the step's wait for the writer's snapshot (what forward and backward did not
//              hide); ratio_to_raw here = synchronous save / this
//   step_beside_async_save  that training step's time; ratio_to_raw = a step without a save in
//              flight (the same round) / this: what the writer's copy and writes cost the step
//              beside it (on a 2-core machine they share the cores and memory bandwidth)
//   async_save_total    until the asynchronous save is committed
//   load_other load into an engine at --other-stage (another layout), pages dropped likewise
// One JSON line each with seconds, MiB/s and ratio_to_raw (raw seconds / seconds; 1.0 = as fast as
// raw I/O), plus peak RSS; the loads also give read_mib (bytes read, /proc/self/io) and
// read_mib_per_s to set beside raw_read's mib_per_s. Checkpoints go to --dir (use a real disk, not tmpfs).
// --consolidate build/tools/tessera: instead, rank 0 runs `tessera checkpoint consolidate` on the
// first save (safetensors, then bin) under GNU time and reports its peak RSS against the largest tensor,
// also above a baseline (the same executable inspecting that checkpoint): the bound is that tensor
// plus one 4 MiB read buffer. --mib 256 --width 2896: 8 tensors of 32 MiB.
// --rss-saves 100: instead, the resident set over 100 asynchronous saves (flat after the first).
// --export: instead, Engine::save_16bit_model (each rank writing its share of model.safetensors)
// against a raw write of as many bytes, per rank.
#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "actors/engine/engine.h"
#include "bench/common/commit.h"
#include "bench/common/process_memory.h"
#include "core/config/load.h"
#include "transport/launch_env.h"

namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void drop_pages(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_tree(const std::string& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_pages(e.path().string());
}

// The same bytes as the rank's checkpoint file (read into memory first, untimed): some disks
// compress or deduplicate, so a pattern would not be an honest baseline.
double raw_write(const std::string& path, const std::vector<char>& bytes) {
  const auto t = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  for (size_t done = 0; done < bytes.size();) {
    const auto n = ::write(fd, bytes.data() + done, std::min<size_t>(size_t(64) << 20, bytes.size() - done));
    if (n <= 0) throw std::runtime_error("raw write failed");
    done += size_t(n);
  }
  ::fsync(fd);
  ::close(fd);
  return since(t);
}

std::vector<char> file_bytes_of(const std::string& path) {
  std::vector<char> out(fs::file_size(path));
  const int fd = ::open(path.c_str(), O_RDONLY);
  for (size_t at = 0; at < out.size();) {
    const auto n = ::pread(fd, out.data() + at, out.size() - at, off_t(at));
    if (n <= 0) break;
    at += size_t(n);
  }
  ::close(fd);
  return out;
}

// Bytes this process has read through read/pread so far (/proc/self/io rchar): what a load reads.
int64_t bytes_read_so_far() {
  std::ifstream in("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (in >> key >> value)
    if (key == "rchar:") return value;
  return -1;
}

// As many bytes as a load read (`bytes`), read sequentially from `paths` in turn, pages dropped: the
// raw baseline of a load that needs more than its own file (below ZeRO-3 every rank holds the whole
// weights). The paths are this rank's own files (its rank file, then the raw write's copy of it), so
// that no bytes come from a page cache another rank filled.
double raw_read_as_much(const std::vector<std::string>& paths, int64_t bytes) {
  for (const auto& p : paths) drop_pages(p);
  std::vector<char> block(size_t(1) << 20);
  const auto t = Clock::now();
  for (const auto& p : paths) {
    const int fd = ::open(p.c_str(), O_RDONLY);
    off_t at = 0;
    for (ssize_t n; bytes > 0 && (n = ::pread(fd, block.data(), size_t(std::min<int64_t>(int64_t(block.size()), bytes)), at)) > 0;)
      at += n, bytes -= n;
    ::close(fd);
  }
  return since(t);
}

double raw_read(const std::string& path) { return raw_read_as_much({path}, int64_t(fs::file_size(path))); }

// --rss-saves N: N asynchronous saves in a row (each waited for), RSS after each: the staging area
// is allocated by the first and reused, so after it the resident set stays flat. One JSON line:
// RSS after the first save, after the last, the most in between, and the growth as a fraction.
void rss_over_saves(tessera::Engine& engine, const std::string& root, int saves, int rank) {
  std::vector<double> rss;
  tessera::CheckpointSaveOptions async{"rss"};
  async.mode = tessera::SaveMode::asynchronous;
  for (int i = 0; i < saves; ++i) {
    engine.save_checkpoint(root, async);
    engine.wait_for_checkpoint();
    rss.push_back(tessera::bench::status_mib("VmRSS"));
  }
  const double peak = *std::max_element(rss.begin(), rss.end());
  std::printf("{\"bench\": \"checkpoint\", \"mode\": \"rss_over_async_saves\", \"rank\": %d, \"saves\": %d, "
              "\"rss_after_first_mib\": %.1f, \"rss_after_last_mib\": %.1f, \"rss_max_mib\": %.1f, "
              "\"growth_after_first\": %.4f, \"staging_mib\": %.1f, \"commit\": \"%s\"}\n",
              rank, saves, rss.front(), rss.back(), peak, (rss.back() - rss.front()) / rss.front(),
              double(engine.checkpoint_staging_bytes()) / (1 << 20), tessera::bench::commit().c_str());
}

// `tessera <args>` as a grandchild under GNU time: its own peak RSS in bytes, and seconds. Not
// wait4 on our own child: a forked child's peak starts at ours (its copy of our address space
// counts, and exec keeps the high-water mark), and this process holds two engines.
std::pair<int64_t, double> run_measured(const std::string& tessera, std::vector<std::string> args,
                                        const std::string& scratch) {
  const std::string time_file = scratch + "/time.txt";
  args.insert(args.begin(), {"/usr/bin/time", "-o", time_file, "-f", "%M", tessera});
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const auto t = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double s = since(t);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw std::runtime_error("/usr/bin/time " + tessera + " " + args.at(6) + " failed (is GNU time installed?)");
  int64_t kib = -1;
  std::ifstream(time_file) >> kib;
  return {kib * 1024, s};
}

// Consolidation's peak RSS against the largest tensor; the baseline is the same executable
// inspecting the same checkpoint (its libraries, the manifest), so the difference is what
// consolidation itself holds.
void consolidate_rss(const std::string& tessera, const std::string& tag_dir, const std::string& out_root,
                     int64_t largest_tensor_bytes, int64_t total_bytes) {
  const int64_t baseline = run_measured(tessera, {"checkpoint", "inspect", tag_dir}, out_root).first;
  for (const std::string format : {"safetensors", "bin"}) {
    const auto out = out_root + "/" + format;
    fs::remove_all(out);
    const auto [peak, s] = run_measured(tessera, {"checkpoint", "consolidate", tag_dir, out, "--format", format}, out_root);
    const double mib = double(total_bytes) / (1 << 20);
    std::printf("{\"bench\": \"checkpoint\", \"mode\": \"consolidate_%s\", \"tensor_mib\": %.1f, \"seconds\": %.4f, "
                "\"mib_per_s\": %.1f, \"peak_rss_bytes\": %lld, \"baseline_rss_bytes\": %lld, \"largest_tensor_bytes\": %lld, "
                "\"peak_rss_over_largest_tensor\": %.3f, \"above_baseline_over_largest_tensor\": %.3f, \"commit\": \"%s\"}\n",
                format.c_str(), mib, s, mib / s, (long long)peak, (long long)baseline, (long long)largest_tensor_bytes,
                double(peak) / double(largest_tensor_bytes), double(peak - baseline) / double(largest_tensor_bytes),
                tessera::bench::commit().c_str());
    fs::remove_all(out);
  }
}

// --export: Engine::save_16bit_model against a raw sequential write + fsync of as many bytes as this
// rank's share (both ranks write at once in both). Medians of `repeats` rounds, alternating which
// goes first; each export writes fresh files (renamed over the last).
void export_throughput(tessera::Engine& engine, const std::string& root, int repeats, int rank, int world, int stage) {
  const auto dir = root + "/export";
  const auto first = engine.save_16bit_model(dir);
  auto bytes = file_bytes_of(dir + "/" + first.files.front());  // the model's own bytes, not a pattern
  bytes.resize(size_t(std::min<int64_t>(first.bytes_written, int64_t(bytes.size()))));
  std::vector<double> export_s, raw_s;
  for (int i = 0; i < repeats; ++i) {
    const auto raw_path = root + "/raw_export_rank" + std::to_string(rank);
    auto raw = [&] { raw_s.push_back(raw_write(raw_path, bytes)); };
    auto save = [&] {
      const auto t = Clock::now();
      engine.save_16bit_model(dir);
      export_s.push_back(since(t));
    };
    if (i % 2) raw(), save();
    else save(), raw();
    fs::remove(raw_path);
  }
  std::sort(export_s.begin(), export_s.end());
  std::sort(raw_s.begin(), raw_s.end());
  const double e = export_s[export_s.size() / 2], r = raw_s[raw_s.size() / 2];
  const double mib = double(first.bytes_written) / (1 << 20);
  std::printf("{\"bench\": \"checkpoint\", \"mode\": \"export_16bit\", \"rank\": %d, \"world\": %d, \"stage\": %d, "
              "\"written_mib\": %.1f, \"files\": %zu, \"seconds\": %.4f, \"mib_per_s\": %.1f, \"raw_write_seconds\": %.4f, "
              "\"ratio_to_raw\": %.3f, \"peak_rss_mib\": %.0f, \"commit\": \"%s\"}\n",
              rank, world, stage, mib, first.files.size(), e, mib / e, r, r / e, tessera::bench::status_mib("VmHWM"),
              tessera::bench::commit().c_str());
}

// Linear layers in a Sequential (ZeRO-3 sees each entry as a unit).
torch::nn::Sequential mlp(int64_t width, int64_t layers) {
  torch::manual_seed(1);
  torch::nn::Sequential m;
  for (int64_t i = 0; i < layers; ++i) m->push_back(torch::nn::Linear(width, width));
  return m;
}

std::string toml(int stage) {
  return "train_micro_batch_size_per_gpu = 4\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = 1e-3\n"
         "[zero_optimization]\nstage = " + std::to_string(stage) + "\n[tessera.transport]\ncollective_timeout_ms = 600000\n";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint save/load throughput against raw sequential I/O"};
  int64_t mib = 256, width = 2048;
  int stage = 2, other_stage = 3, repeats = 3;
  std::string dir = "/var/tmp/tessera_checkpoint_bench", consolidate_with;
  app.add_option("--mib", mib, "MiB of fp32 weights (the states add twice that, the masters alias them)");
  app.add_option("--width", width, "MLP width");
  app.add_option("--stage", stage, "ZeRO stage saved at")->check(CLI::Range(0, 3));
  app.add_option("--other-stage", other_stage, "ZeRO stage of the other layout loaded into")->check(CLI::Range(0, 3));
  app.add_option("--repeats", repeats, "rounds (medians reported)");
  int64_t batch = 4;
  app.add_option("--batch", batch, "rows of the training steps");
  app.add_option("--dir", dir, "where checkpoints and the raw files go (a real disk)");
  app.add_option("--consolidate", consolidate_with, "path of the tessera executable: measure consolidation only");
  bool export_only = false;
  app.add_flag("--export", export_only, "instead: save_16bit_model against a raw write of this rank's share");
  int rss_saves = 0;
  app.add_option("--rss-saves", rss_saves, "instead: this many asynchronous saves, RSS after each (flat after the first)");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  const int64_t layers = std::max<int64_t>(1, (mib << 20) / (width * width * 4));
  auto model = mlp(width, layers);
  auto engine = tessera::initialize(model.ptr(), tessera::config::load_config_text(toml(stage), tessera::config::Format::toml, "bench")).engine;
  auto x = torch::randn({batch, width});
  engine->backward(model->forward(x).pow(2).mean());
  engine->step();
  const std::string root = dir + "/" + env.job;
  if (env.rank == 0) fs::remove_all(root);
  fs::create_directories(root);
  std::vector<double> save_s, load_s, other_s, raw_w_s, raw_r_s, blocked_s, async_total_s, step_s, step_beside_s,
      raw_as_much_s;
  int64_t load_read = 0, other_read = 0;  // bytes the last load of each kind read
  int64_t file_bytes = 0;
  const std::string raw_path = root + "/raw_rank" + std::to_string(env.rank);
  if (export_only) {
    export_throughput(*engine, root, repeats, env.rank, env.world_size, stage);
    if (env.rank == 0) fs::remove_all(root);
    return 0;
  }
  engine->save_checkpoint(root, {"bench"});  // a first save: the file's size and bytes for the raw baseline
  if (!consolidate_with.empty()) {
    if (env.rank == 0) {
      consolidate_rss(consolidate_with, root + "/bench", root, width * width * 4, layers * (width * width + width) * 4);
      fs::remove_all(root);
    }
    return 0;
  }
  if (rss_saves > 0) {
    rss_over_saves(*engine, root, rss_saves, env.rank);
    engine.reset();  // its removal of replaced tags (in the background) ends first
    if (env.rank == 0) fs::remove_all(root);
    return 0;
  }
  const auto rank_file = root + "/bench/rank" + std::to_string(env.rank) + ".safetensors";
  file_bytes = int64_t(fs::file_size(rank_file));
  const auto bytes = file_bytes_of(rank_file);
  auto other_model = mlp(width, layers);
  auto other = tessera::initialize(other_model.ptr(), tessera::config::load_config_text(toml(other_stage), tessera::config::Format::toml, "bench2")).engine;
  for (int i = 0; i < repeats; ++i) {
    // The disk's state drifts (its caches, the blocks just freed): raw and save alternate who goes
    // first, each writes fresh blocks, and medians are reported.
    const auto raw_now = raw_path + "." + std::to_string(i);
    auto raw = [&] { raw_w_s.push_back(raw_write(raw_now, bytes)); };
    auto save = [&] {
      const auto t = Clock::now();
      engine->save_checkpoint(root, {"bench"});
      save_s.push_back(since(t));
    };
    if (i % 2) raw(), save();
    else save(), raw();
    if (i > 0) fs::remove(raw_path + "." + std::to_string(i - 1));
    {  // asynchronous: the time training is blocked (the call, and the next step's wait for the snapshot)
      auto train_step = [&] {
        const auto t = Clock::now();
        engine->backward(model->forward(x).pow(2).mean());
        engine->step();
        return since(t);
      };
      step_s.push_back(train_step());
      tessera::CheckpointSaveOptions async{"bench"};
      async.mode = tessera::SaveMode::asynchronous;
      const auto t = Clock::now();
      engine->save_checkpoint(root, async);
      const double call_s = since(t);
      step_beside_s.push_back(train_step());
      blocked_s.push_back(call_s + engine->last_step_timing().checkpoint_snapshot_wait_s);
      engine->wait_for_checkpoint();
      async_total_s.push_back(since(t));
    }
    raw_r_s.push_back(raw_read(raw_now));
    drop_tree(root + "/bench");
    auto read_before = bytes_read_so_far();
    auto t = Clock::now();
    engine->load_checkpoint(root, {"bench"});
    load_s.push_back(since(t));
    load_read = bytes_read_so_far() - read_before;
    raw_as_much_s.push_back(raw_read_as_much({rank_file, raw_now}, load_read));
    drop_tree(root + "/bench");
    read_before = bytes_read_so_far();
    t = Clock::now();
    other->load_checkpoint(root, {"bench"});
    other_s.push_back(since(t));
    other_read = bytes_read_so_far() - read_before;
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double best_save = median(save_s), best_load = median(load_s), best_other = median(other_s);
  const double best_raw_w = median(raw_w_s), best_raw_r = median(raw_r_s);
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  const double mb = double(file_bytes) / (1 << 20);
  // read_bytes: what a load read (-1: not a load); a stage 0-2 load reads the whole weights, more
  // than its own rank file, so read_mib_per_s is its throughput per byte actually read.
  auto line = [&](const char* mode, double s, double raw, int64_t read_bytes = -1) {
    const double read_mib = read_bytes < 0 ? -1 : double(read_bytes) / (1 << 20);
    std::printf("{\"bench\": \"checkpoint\", \"mode\": \"%s\", \"rank\": %d, \"world\": %d, \"stage\": %d, \"other_stage\": %d, "
                "\"rank_file_mib\": %.1f, \"seconds\": %.4f, \"mib_per_s\": %.1f, \"ratio_to_raw\": %.3f, "
                "\"read_mib\": %.1f, \"read_mib_per_s\": %.1f, \"peak_rss_mib\": %.0f, \"commit\": \"%s\"}\n",
                mode, env.rank, env.world_size, stage, other_stage, mb, s, mb / s, raw / s, read_mib,
                read_bytes < 0 ? -1.0 : read_mib / s, usage.ru_maxrss / 1024.0, tessera::bench::commit().c_str());
  };
  line("raw_write", best_raw_w, best_raw_w);
  line("save", best_save, best_raw_w);
  line("async_save_blocked", median(blocked_s), best_save);  // ratio: sync save seconds / blocked seconds
  line("async_save_total", median(async_total_s), best_raw_w);
  line("step_beside_async_save", median(step_beside_s), median(step_s));
  line("raw_read", best_raw_r, best_raw_r, file_bytes);
  line("load", best_load, best_raw_r, load_read);
  line("raw_read_as_much", median(raw_as_much_s), median(raw_as_much_s), load_read);
  line("load_as_much", best_load, median(raw_as_much_s), load_read);  // ratio: raw read of as many bytes / load
  line("load_other_layout", best_other, best_load, other_read);  // ratio: same-layout load seconds / other-layout seconds
  engine.reset(), other.reset();  // their removals of replaced tags (in the background) end first
  if (env.rank == 0) fs::remove_all(root);
  return 0;
}
