// Helpers of the io tests: a fresh temporary directory per test, raw file bytes, hand-built
// safetensors files and "refused with a CheckpointError" checks. LibTorch-free (the config tests
// include it); byte-wise tensor comparison is tensor_bytes.h.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include <unistd.h>

#include "core/error.h"

namespace tessera::io::test {

// A directory under the system temp dir, unique per process and object, removed on destruction.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tessera_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + "_" +
             std::to_string(std::random_device{}()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

inline std::string read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

inline void write_file_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// The 8-byte little-endian length N.
inline std::string le64(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = char(uint8_t(value >> (8 * i)));
  return bytes;
}

// A safetensors file by hand: le64(json.size()) + json + data.
inline void write_raw_safetensors(const std::string& path, const std::string& json, const std::string& data) {
  write_file_bytes(path, le64(json.size()) + json + data);
}

// The message of the CheckpointError `action` throws; fails the test on any other outcome.
template <class Action>
std::string refusal(Action&& action) {
  try {
    action();
  } catch (const tessera::CheckpointError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected a tessera::CheckpointError, got another exception: " << e.what());
  }
  FAIL("expected a tessera::CheckpointError, nothing was thrown");
  return "";
}

}  // namespace tessera::io::test
