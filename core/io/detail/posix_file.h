// POSIX file helpers for checkpoint files: an owned read-only descriptor, exact positional reads
// (short reads and EINTR retried; end of file is a "truncated" CheckpointError) and atomic
// replacement of a file (<path>.tmp, fsync, rename, fsync of the directory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::io::detail {

// A read-only file descriptor, closed on destruction. Move-only.
class ReadOnlyFile {
 public:
  // CheckpointError naming the path if it cannot be opened or is not a regular file (checked
  // before opening: a FIFO would block open()).
  explicit ReadOnlyFile(const std::string& path);
  ~ReadOnlyFile();
  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&&) = delete;
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  uint64_t size_bytes() const;  // fstat's size now
  // Reads exactly `bytes` bytes at `offset` into `destination`; CheckpointError "<path>: truncated:
  // ..." when the file ends first (`what` names the part being read).
  void pread_exact(void* destination, uint64_t bytes, uint64_t offset, const std::string& what) const;
  // Asks the kernel to start reading [offset, offset + bytes) into the page cache and returns
  // (posix_fadvise WILLNEED, a hint): the disk works while the caller hashes what came before.
  void prefetch(uint64_t offset, uint64_t bytes) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

struct ByteSpan {
  const void* data;
  size_t bytes;
};

// Writes the concatenation of `pieces` to `path` atomically: readers see the old file or the new
// one, never a part. CheckpointError naming the path and the failing call; the .tmp is removed.
void write_file_atomically(const std::string& path, const std::vector<ByteSpan>& pieces);

}  // namespace tessera::io::detail
