// `tessera checkpoint inspect|verify DIR`: a checkpoint without an engine (core/checkpoint/verify.h).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <memory>

#include "core/checkpoint/checkpoint_dir.h"
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

}  // namespace

void add_checkpoint_commands(CLI::App& app) {
  auto* checkpoint = app.add_subcommand("checkpoint", "Inspect and verify checkpoints (no engine, no ranks)");
  checkpoint->require_subcommand(1);
  auto dir = std::make_shared<std::string>();
  auto* inspect = checkpoint->add_subcommand("inspect", "Layout, steps, tensors and what each rank file holds");
  inspect->add_option("DIR", *dir, "a checkpoint root (its latest tag) or one tag's directory")->required();
  inspect->callback([dir] { std::cout << ck::describe(ck::read_manifest(ck::tag_directory(*dir))); });
  auto verify_dir = std::make_shared<std::string>();
  auto* verify = checkpoint->add_subcommand("verify", "Every file against its hashes, every map against its tensor");
  verify->add_option("DIR", *verify_dir, "a checkpoint root (every tag) or one tag's directory")->required();
  verify->callback([verify_dir] { run_verify(*verify_dir); });
}

}  // namespace tessera::cli
