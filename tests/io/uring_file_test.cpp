// io::UringFile (the NVMe swap file) against plain POSIX reads and writes of the same file: every
// aio setting writes and reads back the bytes a pread sees; and its refusals: a file another live
// engine holds, a file truncated behind its back, unaligned requests, a crashed run's leftover
// (replaced, flagged), removal at the end.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/io/uring_file.h"

namespace fs = std::filesystem;
using tessera::io::AioSettings;
using tessera::io::IoDirection;
using tessera::io::UringFile;

namespace {

std::string scratch(const std::string& name) {
  const auto dir = fs::temp_directory_path() / "tessera_uring_test";
  fs::create_directories(dir);
  return (dir / (name + "_" + std::to_string(::getpid()) + ".swap")).string();
}

struct Aligned {
  explicit Aligned(size_t bytes) : n(bytes) { REQUIRE(::posix_memalign(&p, 4096, bytes) == 0); }
  ~Aligned() { std::free(p); }
  char* data() const { return static_cast<char*>(p); }
  void* p = nullptr;
  size_t n;
};

void fill_random(char* p, size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  for (size_t i = 0; i < n; ++i) p[i] = char(rng());
}

std::vector<char> pread_all(const std::string& path, size_t bytes, off_t offset) {
  std::vector<char> out(bytes);
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pread(fd, out.data(), bytes, offset) == ssize_t(bytes));
  ::close(fd);
  return out;
}

}  // namespace

TEST_CASE("Every aio setting writes what pread reads, and reads what was written", "[uring]") {
  struct Case { int64_t block, depth, threads; bool single, overlap; };
  for (const Case c : {Case{1 << 20, 8, 1, false, true}, Case{4096, 2, 1, true, true}, Case{8192, 4, 3, false, false},
                       Case{65536, 1, 2, true, false}}) {
    INFO("block " << c.block << " depth " << c.depth << " threads " << c.threads << " single " << c.single << " overlap " << c.overlap);
    AioSettings s;
    s.block_size = c.block, s.queue_depth = c.depth, s.threads = c.threads, s.single_submit = c.single, s.overlap_events = c.overlap;
    const auto path = scratch("roundtrip");
    const size_t bytes = 3 * 1048576 + 5 * 4096;  // not a multiple of the block: a short last piece
    {
      UringFile file(path, int64_t(bytes) + 8192, s);
      CHECK_FALSE(file.replaced_leftover());
      Aligned out(bytes), back(bytes);
      fill_random(out.data(), bytes, unsigned(c.block + c.threads));
      std::memset(back.data(), 0x5a, bytes);  // must be wholly overwritten
      file.wait(file.submit(IoDirection::write, out.data(), int64_t(bytes), 8192, "test write"));
      CHECK(pread_all(path, bytes, 8192) == std::vector<char>(out.data(), out.data() + bytes));
      file.wait(file.submit(IoDirection::read, back.data(), int64_t(bytes), 8192, "test read"));
      CHECK(std::memcmp(out.data(), back.data(), bytes) == 0);
      const auto n = file.counters();
      CHECK(n.bytes_written == int64_t(bytes));
      CHECK(n.bytes_read == int64_t(bytes));
      CHECK(n.pieces == 2 * ((int64_t(bytes) + c.block - 1) / c.block));
      CHECK(n.fsyncs == 0);
    }
    CHECK_FALSE(fs::exists(path));  // removed with the object
  }
}

TEST_CASE("Negative control: a read at another offset sees other bytes", "[uring]") {
  const auto path = scratch("control");
  UringFile file(path, 8192, AioSettings{});
  Aligned out(8192), back(4096);
  fill_random(out.data(), 8192, 7);
  file.wait(file.submit(IoDirection::write, out.data(), 8192, 0, "write"));
  file.wait(file.submit(IoDirection::read, back.data(), 4096, 4096, "read"));
  CHECK(std::memcmp(out.data(), back.data(), 4096) != 0);
  CHECK(std::memcmp(out.data() + 4096, back.data(), 4096) == 0);
}

TEST_CASE("A crashed run's leftover is replaced, never trusted; a live engine's file is refused", "[uring]") {
  const auto path = scratch("leftover");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    REQUIRE(f);
    std::fputs("an earlier run's states", f);
    std::fclose(f);
  }
  UringFile file(path, 4096, AioSettings{});
  CHECK(file.replaced_leftover());
  CHECK(fs::file_size(path) == 4096);
  try {
    UringFile second(path, 4096, AioSettings{});
    FAIL("a second engine opened a locked swap file");
  } catch (const tessera::OffloadError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("in use by another live engine"));
  }
}

TEST_CASE("A file truncated behind its back, and unaligned requests, are errors naming the path", "[uring]") {
  const auto path = scratch("truncated");
  UringFile file(path, 3 * 4096, AioSettings{});
  Aligned buffer(3 * 4096);
  std::memset(buffer.data(), 1, 3 * 4096);
  file.wait(file.submit(IoDirection::write, buffer.data(), 3 * 4096, 0, "write"));
  REQUIRE(::truncate(path.c_str(), 4096) == 0);
  CHECK(file.size_bytes_now() == 4096);
  try {
    file.wait(file.submit(IoDirection::read, buffer.data(), 2 * 4096, 4096, "reading sub-group 1"));
    FAIL("a read past the truncated end succeeded");
  } catch (const tessera::OffloadError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("reading sub-group 1") && Catch::Contains("truncated"));
  }
  CHECK_THROWS_WITH(file.submit(IoDirection::read, buffer.data() + 512, 4096, 0, "x"), Catch::Contains("4096-aligned"));
  CHECK_THROWS_WITH(file.submit(IoDirection::read, buffer.data(), 4096, 3 * 4096, "x"), Catch::Contains("outside the file"));
}

TEST_CASE("A directory that does not exist is an error naming the path", "[uring]") {
  const auto path = (fs::temp_directory_path() / "tessera_no_such_dir" / "x.swap").string();
  CHECK_THROWS_WITH(UringFile(path, 4096, AioSettings{}), Catch::Contains(path) && Catch::Contains("cannot create"));
}

// Run by full_disk.py inside a private mount namespace whose TESSERA_FULL_DIR is a 1 MiB tmpfs.
TEST_CASE("A swap file larger than the disk is refused at creation, nothing left behind", "[.full_disk]") {
  const char* dir = std::getenv("TESSERA_FULL_DIR");
  REQUIRE(dir);
  const auto path = std::string(dir) + "/big.swap";
  try {
    UringFile file(path, 64 << 20, AioSettings{});
    FAIL("a 64 MiB swap file fitted on a 1 MiB disk");
  } catch (const tessera::OffloadError& e) {
    CHECK_THAT(e.what(), Catch::Contains(path) && Catch::Contains("cannot reserve 67108864 bytes") &&
                             Catch::Contains("No space left on device"));
  }
  CHECK_FALSE(fs::exists(path));
}
