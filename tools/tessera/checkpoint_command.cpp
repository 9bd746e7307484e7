// `tessera checkpoint inspect|verify DIR`, `consolidate DIR OUT` and `import DS_DIR OUT`: a checkpoint
// without an engine (core/checkpoint/verify.h, consolidate.h, deepspeed/import.h).
#include <CLI/CLI.hpp>

#include <array>
#include <filesystem>
#include <iostream>
#include <memory>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/checkpoint/consolidate.h"
#include "core/checkpoint/deepspeed/import.h"
#include "core/checkpoint/verify.h"
#include "core/error.h"
#include "tools/tessera/commands.h"

namespace fs = std::filesystem;

namespace tessera::cli {
namespace {

namespace ck = tessera::checkpoint;

// verify: DIR a tag directory, or a root whose every committed tag is checked.
void run_verify(const std::string& dir) {
  std::vector<std::string> tags;
  if (fs::is_regular_file(fs::path(dir) / ck::kManifestName)) {
    tags.push_back(dir);
  } else {
    for (const auto& tag : ck::committed_tags(dir)) tags.push_back((fs::path(dir) / tag).string());
    if (tags.empty()) throw CheckpointError(dir + ": no committed checkpoint (no tag directory with a manifest)");
  }
  int bad = 0;
  for (const auto& tag_dir : tags) {
    const auto report = ck::verify_tag(tag_dir);
    if (report.ok()) {
      std::cout << tag_dir << ": ok (" << report.bytes_checked << " bytes, " << report.maps_checked << " maps)\n";
      continue;
    }
    ++bad;
    std::cout << tag_dir << ": " << report.problems.size() << " problem(s)\n";
    for (const auto& p : report.problems) std::cout << "  " << p << "\n";
  }
  if (bad) throw CLI::RuntimeError(1);
}

struct ConsolidateArgs {
  std::string dir, out, tag, format = "safetensors";
  int64_t max_shard_bytes = ck::kDefaultMaxShardBytes;
  bool exclude_frozen_parameters = ck::ConsolidateOptions{}.exclude_frozen_parameters;
};

void run_consolidate(const ConsolidateArgs& a) {
  ck::ConsolidateOptions options;
  options.tag = a.tag;
  options.format = ck::parse_consolidate_format(a.format);
  options.max_shard_bytes = a.max_shard_bytes;
  options.exclude_frozen_parameters = a.exclude_frozen_parameters;
  const auto report = ck::consolidate(a.dir, a.out, options);
  std::cout << report.tag_dir << ": " << report.tensors << " tensors (" << report.kind << ", f32)"
            << (report.frozen ? " and " + std::to_string(report.frozen) + " frozen (their dtype)" : std::string()) << ", " << report.tensor_bytes
            << " bytes, largest " << report.largest_tensor_bytes << "; " << report.bytes_read
            << " bytes read and verified\n";
  for (const auto& f : report.files) std::cout << "  " << (fs::path(report.out_dir) / f).string() << "\n";
}

void add_consolidate(CLI::App& checkpoint) {
  auto args = std::make_shared<ConsolidateArgs>();
  auto* c = checkpoint.add_subcommand(
      "consolidate", "The fp32 weights, whole, as safetensors (or a torch.load-able pytorch_model.bin) in a new directory");
  c->add_option("DIR", args->dir, "a checkpoint root (its latest tag, or --tag) or one tag's directory")->required();
  c->add_option("OUT", args->out, "the output directory (must not exist, or be empty)")->required();
  c->add_option("--tag", args->tag, "the tag under DIR (default: the one DIR/latest names)");
  c->add_option("--format", args->format, "safetensors (default) or bin")->check(CLI::IsMember({"safetensors", "bin"}));
  c->add_option("--max-shard-bytes", args->max_shard_bytes, "shard above this many bytes (default 5e9, as transformers)")
      ->check(CLI::PositiveNumber);
  c->add_flag("--exclude-frozen-parameters", args->exclude_frozen_parameters,
              "leave out the frozen parameters (written by default in their saved dtype, as zero_to_fp32 does)");
  c->callback([args] { run_consolidate(*args); });
}

// import: a DeepSpeed ZeRO checkpoint (no Python) as a new tessera checkpoint root.
void add_import(CLI::App& checkpoint) {
  auto args = std::make_shared<std::array<std::string, 3>>();  // DS_DIR, OUT, tag
  auto* c = checkpoint.add_subcommand(
      "import",
      "A DeepSpeed ZeRO-1/2/3 checkpoint (latest, global_stepN/*.pt; or the universal format, latest_universal) as a "
      "tessera checkpoint root OUT");
  c->add_option("DS_DIR", (*args)[0], "the DeepSpeed checkpoint directory (holding `latest`)")->required();
  c->add_option("OUT", (*args)[1], "the output directory (must not exist, or be empty)")->required();
  c->add_option("--tag", (*args)[2],
                "DeepSpeed's tag under DS_DIR (default: the one DS_DIR/latest, else DS_DIR/latest_universal, names)");
  c->callback([args] {
    ck::deepspeed::ImportOptions options;
    options.tag = (*args)[2];
    const auto r = ck::deepspeed::import_deepspeed((*args)[0], (*args)[1], options);
    std::cout << r.source_dir << ": ZeRO-" << r.stage << ", " << r.world << " ranks, " << r.dtype << ", " << r.parameters
              << " parameters (" << r.elements << " elements) -> " << (fs::path(r.out_dir) / r.tag).string() << " ("
              << r.bytes_written << " bytes)\n";
  });
}

}  // namespace

void add_checkpoint_commands(CLI::App& app) {
  auto* checkpoint = app.add_subcommand("checkpoint", "Inspect, verify, consolidate and import checkpoints (no engine, no ranks)");
  checkpoint->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto* inspect = checkpoint->add_subcommand("inspect", "Layout, steps, tensors and what each rank file holds");
  inspect->add_option("DIR", *dir, "a checkpoint root (its latest tag) or one tag's directory")->required();
  inspect->callback([dir] { std::cout << ck::describe(ck::read_manifest(ck::tag_directory(*dir))); });
  auto verify_dir = std::make_shared<std::string>();
  auto* verify = checkpoint->add_subcommand("verify", "Every file against its hashes, every map against its tensor");
  verify->add_option("DIR", *verify_dir, "a checkpoint root (every tag) or one tag's directory")->required();
  verify->callback([verify_dir] { run_verify(*verify_dir); });
  add_consolidate(*checkpoint);
  add_import(*checkpoint);
}

}  // namespace tessera::cli
