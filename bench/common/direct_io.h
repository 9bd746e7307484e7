// Raw O_DIRECT sequential I/O, one synchronous request of `block` bytes after another (what
// `dd oflag=direct` / `iflag=direct` does): the disk's own pace, the baseline NVMe offload's
// throughput is a ratio to. O_DIRECT bypasses the page cache, so a machine with much free memory
// does not hide the disk; no fsync (the swap files are never fsynced either).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tessera::bench {

struct DirectIoRate {
  double write_s = 0, read_s = 0;  // seconds for all of `bytes`
  int64_t bytes = 0;
  double write_gbps() const { return write_s > 0 ? double(bytes) / write_s / 1e9 : 0; }
  double read_gbps() const { return read_s > 0 ? double(bytes) / read_s / 1e9 : 0; }
};

// Writes `bytes` (rounded up to `block`) to a new file at `path`, reads them back, removes it.
inline DirectIoRate raw_direct_io(const std::string& path, int64_t bytes, int64_t block) {
  const int64_t blocks = (bytes + block - 1) / block;
  void* buffer = nullptr;
  if (posix_memalign(&buffer, 4096, size_t(block)) != 0) throw std::runtime_error("raw_direct_io: no memory");
  std::memset(buffer, 0x5a, size_t(block));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::free(buffer);
    throw std::runtime_error(path + ": " + std::strerror(errno));
  }
  auto pass = [&](bool write) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < blocks; ++i) {
      const auto n = write ? ::pwrite(fd, buffer, size_t(block), off_t(i * block))
                           : ::pread(fd, buffer, size_t(block), off_t(i * block));
      if (n != block) {
        const int e = errno;
        ::close(fd), ::unlink(path.c_str()), std::free(buffer);
        throw std::runtime_error(path + ": " + (write ? "pwrite: " : "pread: ") + std::strerror(e));
      }
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  DirectIoRate r;
  r.bytes = blocks * block;
  r.write_s = pass(true);
  r.read_s = pass(false);
  ::close(fd);
  ::unlink(path.c_str());
  std::free(buffer);
  return r;
}

}  // namespace tessera::bench
