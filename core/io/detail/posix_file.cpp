#include "core/io/detail/posix_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace tessera::io::detail {
namespace {

constexpr uint64_t kMaxCallBytes = uint64_t(1) << 30;  // Linux moves at most ~2 GiB per call anyway

[[noreturn]] void fail(const std::string& path, const char* call, int error) {
  throw CheckpointError(path + ": " + call + " failed: " + std::strerror(error));
}

const char* file_type(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a plain file";
}

[[noreturn]] void not_regular(const std::string& path, mode_t mode) {
  throw CheckpointError(path + ": not a regular file (" + file_type(mode) + "); weights are read from regular files only");
}

}  // namespace

ReadOnlyFile::ReadOnlyFile(const std::string& path) : path_(path) {
  // The type first: open() of a FIFO blocks until a writer comes, which may be never.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) not_regular(path, st.st_mode);
  // O_NONBLOCK: should the path become a FIFO after the stat, open returns at once and fstat
  // below refuses it (it does not change reads of a regular file).
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail(path, "open", errno);
  if (::fstat(fd_, &st) != 0) {
    const int error = errno;
    ::close(fd_);
    fail(path, "fstat", error);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    not_regular(path, st.st_mode);
  }
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) ::close(fd_);
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) {
  other.fd_ = -1;
}

uint64_t ReadOnlyFile::size_bytes() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) fail(path_, "fstat", errno);
  return uint64_t(st.st_size);
}

void ReadOnlyFile::prefetch(uint64_t offset, uint64_t bytes) const {
  if (fd_ >= 0 && bytes > 0) ::posix_fadvise(fd_, off_t(offset), off_t(bytes), POSIX_FADV_WILLNEED);
}

void ReadOnlyFile::pread_exact(void* destination, uint64_t bytes, uint64_t offset, const std::string& what) const {
  auto* out = static_cast<char*>(destination);
  uint64_t done = 0;
  while (done < bytes) {
    const size_t want = size_t(std::min(bytes - done, kMaxCallBytes));
    const ssize_t got = ::pread(fd_, out + done, want, off_t(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      fail(path_, "pread", errno);
    }
    if (got == 0)
      throw CheckpointError(path_ + ": truncated: " + what + " needs bytes [" + std::to_string(offset) + ", " +
                            std::to_string(offset + bytes) + ") but the file ends at " +
                            std::to_string(offset + done));
    done += uint64_t(got);
  }
}

void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& pieces) {
  const std::string tmp = path + ".tmp";
  int fd;
  do {
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) fail(tmp, "open", errno);
  auto give_up = [&](const char* call, int error) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail(tmp, call, error);
  };
  for (const ByteSpan& piece : pieces) {
    const char* in = static_cast<const char*>(piece.data);
    size_t done = 0;
    while (done < piece.bytes) {
      const ssize_t put = ::write(fd, in + done, size_t(std::min<uint64_t>(piece.bytes - done, kMaxCallBytes)));
      if (put < 0) {
        if (errno == EINTR) continue;
        give_up("write", errno);
      }
      done += size_t(put);
    }
  }
  if (::fsync(fd) != 0) give_up("fsync", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) give_up("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) give_up("rename", errno);
  // The rename is durable once the directory is synced.
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    const int synced = ::fsync(dir_fd);
    const int error = errno;
    ::close(dir_fd);
    if (synced != 0) fail(dir, "fsync", error);
  }
}

}  // namespace tessera::io::detail
