#include "core/checkpoint/staged_directory.h"

#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/checkpoint/checkpoint_dir.h"
#include "core/error.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {

StagedDirectory::StagedDirectory(const std::string& out, const std::string& what) : out_(fs::path(out).lexically_normal()) {
  if (out_.filename().empty()) out_ = out_.parent_path();  // "out/" names "out"
  std::error_code ec;
  if (fs::exists(out_, ec)) {
    if (!fs::is_directory(out_) || !fs::is_empty(out_))
      throw CheckpointError(out_.string() + ": exists and is not an empty directory; " + what + " writes a new one");
    replace_empty_ = true;
  }
  const auto parent = out_.has_parent_path() ? out_.parent_path() : fs::path(".");
  fs::create_directories(parent, ec);
  staged_ = parent / ("." + out_.filename().string() + ".partial-" + std::to_string(::getpid()));
  fs::remove_all(staged_, ec);  // a leftover of a killed run of this pid's predecessor
  if (!fs::create_directory(staged_, ec))
    throw CheckpointError(staged_.string() + ": cannot be created: " + (ec ? ec.message() : "exists"));
}

StagedDirectory::~StagedDirectory() {
  std::error_code ec;
  if (!committed_) fs::remove_all(staged_, ec);
}

void StagedDirectory::commit() {
  fsync_path(staged_.string());
  // An empty OUT is replaced by rename(2) itself; otherwise OUT must still be absent.
  const int renamed = replace_empty_ ? ::rename(staged_.c_str(), out_.c_str())
                                     : ::renameat2(AT_FDCWD, staged_.c_str(), AT_FDCWD, out_.c_str(), RENAME_NOREPLACE);
  if (renamed != 0) throw CheckpointError(out_.string() + ": cannot be put in place (rename): " + std::strerror(errno));
  committed_ = true;
  fsync_path(out_.has_parent_path() ? out_.parent_path().string() : ".");
}

}  // namespace tessera::checkpoint
