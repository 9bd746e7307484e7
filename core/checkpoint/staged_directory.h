// A new output directory OUT written whole or not at all (consolidate, the DeepSpeed import): its
// files go into a hidden sibling, DIR_OF_OUT/.<name>.partial-<pid>, which commit() syncs and renames
// to OUT; destroyed uncommitted (an error), the sibling is removed, and a kill -9 leaves only it.
// OUT must be absent or an empty directory (refused otherwise, before anything is written).
#pragma once

#include <filesystem>
#include <string>

namespace tessera::checkpoint {

class StagedDirectory {
 public:
  // `what` names the operation in the refusal ("consolidate", "import").
  StagedDirectory(const std::string& out, const std::string& what);
  ~StagedDirectory();
  StagedDirectory(const StagedDirectory&) = delete;
  StagedDirectory& operator=(const StagedDirectory&) = delete;

  const std::filesystem::path& staged() const { return staged_; }
  std::string path_of(const std::string& file) const { return (staged_ / file).string(); }
  std::string out() const { return out_.string(); }
  void commit();

 private:
  std::filesystem::path out_, staged_;
  bool replace_empty_ = false, committed_ = false;
};

}  // namespace tessera::checkpoint
