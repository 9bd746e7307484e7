#include "core/checkpoint/checkpoint_dir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <fstream>
#include <sstream>

#include "core/checkpoint/manifest.h"
#include "core/error.h"
#include "core/io/detail/posix_file.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {
namespace {

[[noreturn]] void fail(const std::string& path, const char* call, int error) {
  throw CheckpointError(path + ": " + call + " failed: " + std::strerror(error));
}

}  // namespace

uint64_t xxh3(const void* data, size_t bytes) { return XXH3_64bits(data, bytes); }

std::vector<uint64_t> chunk_hashes(const void* data, int64_t bytes, int64_t chunk_bytes) {
  std::vector<uint64_t> out;
  const auto* p = static_cast<const char*>(data);
  for (int64_t at = 0; at < bytes; at += chunk_bytes) out.push_back(xxh3(p + at, size_t(std::min(chunk_bytes, bytes - at))));
  return out;
}

StreamHash::StreamHash() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}
StreamHash::~StreamHash() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }
void StreamHash::update(const void* data, size_t bytes) { XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, bytes); }
uint64_t StreamHash::digest() const { return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_)); }

uint64_t hash_file(const std::string& path) {
  io::detail::ReadOnlyFile file(path);
  const uint64_t size = file.size_bytes();
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> block(size_t(std::min<uint64_t>(size, uint64_t(kChunkBytes))));
  try {
    for (uint64_t at = 0; at < size; at += block.size()) {
      const uint64_t n = std::min<uint64_t>(block.size(), size - at);
      file.pread_exact(block.data(), n, at, "its bytes");
      XXH3_64bits_update(state, block.data(), n);
    }
  } catch (...) {
    XXH3_freeState(state);
    throw;
  }
  const uint64_t h = XXH3_64bits_digest(state);
  XXH3_freeState(state);
  return h;
}

void check_tag(const std::string& tag) {
  bool printable = !tag.empty();
  for (unsigned char c : tag) printable = printable && c > ' ' && c < 127 && c != '/' && c != '\\';
  if (!printable || tag[0] == '.' || tag == "latest")
    throw CheckpointError("checkpoint tag '" + tag + "' is not a plain directory name (no '/', spaces or leading '.', not 'latest')");
}

std::string partial_dir(const std::string& root, const std::string& tag, const std::string& nonce) {
  return (fs::path(root) / ("." + tag + ".partial-" + nonce)).string();
}

void remove_partials(const std::string& root, const std::set<std::string>& skip) {
  std::set<std::string> skipped;
  for (const auto& p : skip) skipped.insert(fs::path(p).lexically_normal().string());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto name = entry.path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(".partial-") != std::string::npos &&
        !skipped.count(entry.path().lexically_normal().string()))
      fs::remove_all(entry.path(), ec);
  }
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path, "open", errno);
  const int synced = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (synced != 0) fail(path, "fsync", error);
}

std::string commit_tag(const std::string& root, const std::string& partial, const std::string& tag) {
  const std::string final_dir = (fs::path(root) / tag).string();
  fsync_path(partial);
  if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_NOREPLACE) != 0) {
    if (errno != EEXIST) fail(final_dir, "rename", errno);
    // An older checkpoint of the same tag: swap them in one step; the old one is now at `partial`.
    if (::renameat2(AT_FDCWD, partial.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) != 0)
      fail(final_dir, "rename (exchange)", errno);
    fsync_path(root);
    return partial;
  }
  fsync_path(root);
  return "";
}

void write_latest(const std::string& root, const std::string& tag) {
  io::detail::write_file_atomically((fs::path(root) / "latest").string(), {{tag.data(), tag.size()}});
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(path + ": cannot be read: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string read_latest(const std::string& root) {
  const auto path = (fs::path(root) / "latest").string();
  if (!fs::exists(path))
    throw CheckpointError(root + ": no 'latest' file: not a checkpoint directory, or nothing was saved there yet");
  auto tag = read_text(path);
  while (!tag.empty() && (tag.back() == '\n' || tag.back() == ' ')) tag.pop_back();
  check_tag(tag);
  return tag;
}

std::vector<std::string> committed_tags(const std::string& root) {
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const auto manifest = entry.path() / kManifestName;
    if (entry.is_directory() && entry.path().filename().string()[0] != '.' && fs::exists(manifest))
      found.push_back({fs::last_write_time(manifest, ec), entry.path().filename().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& [time, tag] : found) out.push_back(tag);
  return out;
}

// Out of sight in one rename first (a partial directory, which the next save clears if a kill
// interrupts the removal), so no tag is ever half removed.
void remove_tag(const std::string& root, const std::string& tag) {
  check_tag(tag);
  const auto from = fs::path(root) / tag;
  const auto to = partial_dir(root, tag, "removed");
  std::error_code ec;
  fs::remove_all(to, ec);
  fs::rename(from, to, ec);
  if (ec) throw CheckpointError(from.string() + ": cannot be removed: " + ec.message());
  fsync_path(root);
  fs::remove_all(to, ec);
}

}  // namespace tessera::checkpoint
