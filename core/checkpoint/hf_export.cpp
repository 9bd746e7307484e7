#include "core/checkpoint/hf_export.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/checkpoint/hf_shards.h"
#include "core/error.h"

namespace tessera::checkpoint {
namespace {

constexpr int64_t kSliceAlign = 4096;  // replicated bytes change writer at page edges

// The edges of `world` slices of a file's data section [begin, end): edges[k] .. edges[k + 1].
std::vector<int64_t> slice_edges(int64_t begin, int64_t end, int world) {
  std::vector<int64_t> edges{begin};
  for (int k = 1; k < world; ++k) {
    const int64_t cut = begin + (end - begin) * k / world / kSliceAlign * kSliceAlign;
    edges.push_back(std::max(edges.back(), cut));
  }
  edges.push_back(end);
  return edges;
}

class WriteList {
 public:
  WriteList(int file, int rank, std::vector<int64_t> edges) : file_(file), rank_(rank), edges_(std::move(edges)) {}

  // A run of `bytes` at `file_offset` from `buffer_offset`, held by `holders`.
  void add(int64_t file_offset, int64_t buffer_offset, int64_t bytes, const std::vector<int>& holders) {
    if (holders.size() <= 1) return append(file_offset, buffer_offset, bytes);
    while (bytes > 0) {
      const auto k = int(std::upper_bound(edges_.begin(), edges_.end(), file_offset) - edges_.begin()) - 1;
      const int64_t part = std::min(bytes, edges_[size_t(k) + 1] - file_offset);
      const bool holds = std::binary_search(holders.begin(), holders.end(), k);
      if ((holds ? k : holders[size_t(k) % holders.size()]) == rank_) append(file_offset, buffer_offset, part);
      file_offset += part, buffer_offset += part, bytes -= part;
    }
  }
  std::vector<ExportWrite> take() { return std::move(writes_); }

 private:
  void append(int64_t file_offset, int64_t buffer_offset, int64_t bytes) {
    if (!writes_.empty()) {
      auto& last = writes_.back();
      if (last.file_offset + last.bytes == file_offset && last.buffer_offset + last.bytes == buffer_offset) {
        last.bytes += bytes;
        return;
      }
    }
    writes_.push_back({file_, file_offset, buffer_offset, bytes});
  }
  int file_, rank_;
  std::vector<int64_t> edges_;
  std::vector<ExportWrite> writes_;
};

}  // namespace

ExportLayout plan_export(const std::vector<OutputTensor>& tensors, int64_t max_shard_bytes,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (const auto& t : tensors) sizes.push_back(t.bytes()), names.push_back(t.name);
  const auto shards = plan_shards(sizes, max_shard_bytes, "model", "safetensors");
  ExportLayout layout;
  layout.file_of.resize(tensors.size());
  layout.offset_of.resize(tensors.size());
  int64_t total = 0;
  for (size_t f = 0; f < shards.size(); ++f) {
    std::vector<OutputTensor> in_file;
    for (size_t t : shards[f].tensors) in_file.push_back(tensors[t]);
    ExportFile file{shards[f].file, safetensors_prefix(in_file, metadata), 0};
    int64_t offset = int64_t(file.prefix.size());
    for (size_t t : shards[f].tensors) {
      layout.file_of[t] = int(f);
      layout.offset_of[t] = offset;
      offset += sizes[t];
    }
    file.bytes = offset;
    total += shards[f].bytes;
    layout.files.push_back(std::move(file));
  }
  if (shards.size() > 1) {
    layout.index_name = shard_index_name("model", "safetensors");
    layout.index_json = shard_index_json(shards, names, total);
  }
  return layout;
}

std::vector<ExportWrite> export_writes(const affine::TensorMap& map, const ExportLayout& layout, int file,
                                       int64_t tensor_offset, int rank, int world) {
  const auto mine = map.ranks.find(rank);
  if (mine == map.ranks.end()) return {};
  const auto& f = layout.files.at(size_t(file));
  WriteList list(file, rank, slice_edges(int64_t(f.prefix.size()), f.bytes, world));
  const int64_t es = affine::element_size(map.dtype);
  const auto tensor_strides = affine::row_major_strides(map.shape);
  for (const auto& piece : mine->second.pieces) {
    if (piece.box.is_empty()) continue;
    const int n = piece.box.ndim();
    if (n == 0) {
      list.add(tensor_offset, piece.offset * es, es, piece.holders);
      continue;
    }
    // Runs along the last axis (contiguous in the file; in the buffer when its stride is 1).
    const int last = n - 1;
    const int64_t run = piece.strides[last] == 1 ? piece.box.shape[last] : 1;
    affine::Dims index = piece.box.origin;
    while (true) {
      for (int64_t j = 0; j < piece.box.shape[last]; j += run) {
        index[last] = piece.box.origin[last] + j;
        int64_t element = 0;
        for (int k = 0; k < n; ++k) element += index[k] * tensor_strides[k];
        list.add(tensor_offset + element * es, piece.address_of(index) * es, run * es, piece.holders);
      }
      int k = last - 1;  // the odometer over the other axes
      while (k >= 0 && ++index[k] == piece.box.end(k)) index[k] = piece.box.origin[k], --k;
      if (k < 0) break;
    }
  }
  return list.take();
}

void create_export_file(const std::string& path, const ExportFile& file, ExportFill fill) {
  OutputFile out(path);
  out.write(file.prefix.data(), file.prefix.size());
  if (fill == ExportFill::nan_bytes) {
    const std::string block(size_t(1) << 20, '\xff');
    for (int64_t left = file.bytes - int64_t(file.prefix.size()); left > 0; left -= int64_t(block.size()))
      out.write(block.data(), size_t(std::min<int64_t>(left, int64_t(block.size()))));
  }
  out.sync_and_close();
  if (fill == ExportFill::sparse && ::truncate(path.c_str(), file.bytes) != 0)
    throw CheckpointError(path + ": cannot be sized to " + std::to_string(file.bytes) + " bytes: " + std::strerror(errno));
}

PositionalWriter::PositionalWriter(std::string path) : path_(std::move(path)) {
  do {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) throw CheckpointError(path_ + ": cannot be opened for writing: " + std::strerror(errno));
}

PositionalWriter::~PositionalWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void PositionalWriter::write_at(const void* data, int64_t bytes, int64_t offset) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, size_t(std::min<int64_t>(bytes, int64_t(1) << 30)), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw CheckpointError(path_ + ": write of " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset) +
                            " failed: " + (n < 0 ? std::strerror(errno) : "no progress"));
    p += n, bytes -= n, offset += n;
  }
}

void PositionalWriter::sync_and_close() {
  if (::fsync(fd_) != 0) throw CheckpointError(path_ + ": fsync failed: " + std::strerror(errno));
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw CheckpointError(path_ + ": close failed: " + std::strerror(errno));
}

}  // namespace tessera::checkpoint
