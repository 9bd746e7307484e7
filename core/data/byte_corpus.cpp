#include "core/data/byte_corpus.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "core/error.h"

namespace tessera::data {
namespace {

void append_file(const std::filesystem::path& path, std::vector<uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("corpus: cannot read '" + path.string() + "'");
  out.insert(out.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

ByteCorpus::ByteCorpus(const std::vector<std::string>& paths) {
  namespace fs = std::filesystem;
  for (const auto& p : paths) {
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      std::vector<fs::path> files;
      for (const auto& entry : fs::directory_iterator(p, ec))
        if (entry.is_regular_file()) files.push_back(entry.path());
      if (ec) throw Error("corpus: cannot list '" + p + "': " + ec.message());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) append_file(f, bytes_);
    } else if (fs::is_regular_file(p, ec)) {
      append_file(p, bytes_);
    } else {
      throw Error("corpus: '" + p + "' is neither a file nor a directory");
    }
  }
  if (bytes_.empty()) throw Error("corpus: no bytes in the given paths");
}

TokenBatch ByteCorpus::batch(uint64_t seed, int64_t step, int64_t micro, int64_t global_batch, int64_t context,
                             int64_t rank, int64_t world) const {
  if (world < 1 || rank < 0 || rank >= world || global_batch % world != 0)
    throw Error("corpus: global batch " + std::to_string(global_batch) + " cannot be split over " +
                std::to_string(world) + " ranks (rank " + std::to_string(rank) + ")");
  if (int64_t(bytes_.size()) < context + 2)
    throw Error("corpus: " + std::to_string(bytes_.size()) + " bytes is shorter than one window of " +
                std::to_string(context + 1));
  // One generator per (seed, step, micro): all ranks draw the same global offsets.
  std::seed_seq seq{uint32_t(seed), uint32_t(seed >> 32), uint32_t(step), uint32_t(step >> 32), uint32_t(micro)};
  std::mt19937_64 rng(seq);
  const uint64_t span = bytes_.size() - uint64_t(context) - 1;
  const int64_t local = global_batch / world;
  auto window = at::empty({local, context + 1}, at::kLong);
  auto* out = window.data_ptr<int64_t>();
  for (int64_t b = 0; b < global_batch; ++b) {
    const uint64_t offset = rng() % (span + 1);
    if (b / local != rank) continue;
    const int64_t row = b % local;
    for (int64_t t = 0; t <= context; ++t) out[row * (context + 1) + t] = bytes_[offset + t];
  }
  return {window.narrow(1, 0, context).contiguous(), window.narrow(1, 1, context).contiguous()};
}

}  // namespace tessera::data
