#include "core/checkpoint/saved_tensor_reader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <tuple>

#include "core/affine/builders.h"
#include "core/affine/planner.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/error.h"
#include "core/io/detail/posix_file.h"

namespace fs = std::filesystem;

namespace tessera::checkpoint {
namespace {

std::string what(const SavedMap& saved) { return "tensor '" + saved.map.name + "' (" + saved.kind + ")"; }

// Calls fn(source_offset, target_offset, elements) for each run of `seg` contiguous on both sides:
// the planner collapsed axes contiguous on both sides, so a dense copy is one run; a strided one
// goes row by row (or element by element when even its rows are strided).
template <typename Fn>
void for_each_run(const affine::Segment& seg, Fn&& fn) {
  const int ndim = seg.shape.size();
  if (ndim == 0) return fn(seg.source_offset, seg.target_offset, int64_t{1});
  if (seg.shape.product() == 0) return;
  const bool rows = seg.source_strides[ndim - 1] == 1 && seg.target_strides[ndim - 1] == 1;
  const int outer = rows ? ndim - 1 : ndim;  // axes walked one index at a time
  const int64_t run = rows ? seg.shape[ndim - 1] : 1;
  affine::Dims i(ndim, 0);
  for (;;) {
    int64_t s = seg.source_offset, t = seg.target_offset;
    for (int k = 0; k < outer; ++k) s += i[k] * seg.source_strides[k], t += i[k] * seg.target_strides[k];
    fn(s, t, run);
    int k = outer - 1;
    while (k >= 0 && ++i[k] == seg.shape[k]) i[k] = 0, --k;
    if (k < 0) return;
  }
}

}  // namespace

SavedTensorReader::SavedTensorReader(const Manifest& manifest, std::string tag_dir)
    : manifest_(manifest), tag_dir_(std::move(tag_dir)) {
  int64_t largest_chunk = 0;
  for (const auto& f : manifest_.files) {
    const auto path = (fs::path(tag_dir_) / f.file).string();
    if (!fs::is_regular_file(path)) throw CheckpointError(path + ": missing (or not a regular file)");
    auto file = std::make_unique<io::detail::ReadOnlyFile>(path);
    if (int64_t(file->size_bytes()) != f.bytes)
      throw CheckpointError(path + ": " + std::to_string(file->size_bytes()) + " bytes, the manifest says " +
                            std::to_string(f.bytes) + " (truncated or replaced)");
    if (!files_.emplace(f.rank, std::move(file)).second)
      throw CheckpointError(tag_dir_ + ": the manifest lists two files of rank " + std::to_string(f.rank));
    for (const auto& b : f.buffers) largest_chunk = std::max(largest_chunk, b.chunk_bytes);
  }
  chunk_.resize(size_t(largest_chunk));
}

SavedTensorReader::~SavedTensorReader() = default;

SavedTensorReader::Source SavedTensorReader::source(const SavedMap& saved, int file_rank) const {
  Source src;
  const auto key = saved.buffers.find(file_rank);
  const auto handle = files_.find(file_rank);
  if (key == saved.buffers.end() || handle == files_.end())
    throw CheckpointError(tag_dir_ + ": " + what(saved) + " has pieces in file rank " + std::to_string(file_rank) +
                          ", which names no file or buffer in the manifest");
  src.file = &manifest_.file_of_rank(file_rank);
  src.buffer = src.file->find(key->second);
  src.handle = handle->second.get();
  if (!src.buffer)
    throw CheckpointError(tag_dir_ + ": " + what(saved) + " lies in buffer '" + key->second + "' of " + src.file->file +
                          ", which the manifest does not list");
  if (src.buffer->dtype != saved.map.dtype)
    throw CheckpointError(tag_dir_ + ": " + what(saved) + " is " + affine::dtype_name(saved.map.dtype) + ", buffer '" +
                          src.buffer->key + "' of " + src.file->file + " is " + affine::dtype_name(src.buffer->dtype));
  return src;
}

affine::Plan SavedTensorReader::plan(const SavedMap& saved) const {
  const auto target = affine::replicated({saved.map.name, saved.map.dtype, saved.map.shape}, 1);
  affine::Plan plan;
  try {
    plan = affine::plan(target, saved.map);
  } catch (const Error& e) {
    throw CheckpointError(tag_dir_ + ": " + what(saved) + ": its saved map cannot be read whole: " + e.what());
  }
  for (const auto& seg : plan.segments) {  // every byte it reads lies inside its buffer
    const auto src = source(saved, seg.source_rank);
    int64_t last = seg.source_offset;
    for (int k = 0; k < seg.shape.size(); ++k) last += (seg.shape[k] - 1) * seg.source_strides[k];
    if (seg.source_offset < 0 || last >= src.buffer->elements)
      throw CheckpointError(tag_dir_ + ": " + what(saved) + " reaches outside buffer '" + src.buffer->key + "' of " +
                            src.file->file);
  }
  return plan;
}

void SavedTensorReader::read_chunk(const SavedMap& saved, const Source& src, int64_t chunk, char* into) {
  const auto& b = *src.buffer;
  const int64_t bytes = b.elements * affine::element_size(b.dtype);
  const int64_t begin = chunk * b.chunk_bytes, n = std::min(b.chunk_bytes, bytes - begin);
  src.handle->pread_exact(into, uint64_t(n), uint64_t(b.data_offset + begin), "buffer '" + b.key + "'");
  bytes_read_ += n;
  if (xxh3(into, size_t(n)) != b.chunk_hashes.at(size_t(chunk)))
    throw CheckpointError(src.handle->path() + ": buffer '" + b.key + "' bytes [" + std::to_string(begin) + ", " +
                          std::to_string(begin + n) + ") do not match their hash (corrupted); " + what(saved) +
                          " reads them");
}

// Copies `elements` from the buffer (at source_element) to `target`, chunk by chunk: a chunk the
// run covers whole is read into the target and verified there; a partial one goes through chunk_.
void SavedTensorReader::copy_run(const SavedMap& saved, const Source& src, int64_t source_element, char* target,
                                 int64_t elements) {
  const auto& b = *src.buffer;
  const int64_t es = affine::element_size(b.dtype), buffer_bytes = b.elements * es;
  int64_t at = source_element * es;
  const int64_t end = at + elements * es;
  while (at < end) {
    const int64_t chunk = at / b.chunk_bytes, chunk_begin = chunk * b.chunk_bytes;
    const int64_t chunk_end = std::min(chunk_begin + b.chunk_bytes, buffer_bytes);
    const int64_t take = std::min(end, chunk_end) - at;
    if (at == chunk_begin && take == chunk_end - chunk_begin && !(cached_buffer_ == &b && cached_chunk_ == chunk)) {
      read_chunk(saved, src, chunk, target);
    } else {
      if (cached_buffer_ != &b || cached_chunk_ != chunk) {
        cached_buffer_ = nullptr;  // invalid until verified
        read_chunk(saved, src, chunk, chunk_.data());
        cached_buffer_ = &b, cached_chunk_ = chunk;
      }
      std::memcpy(target, chunk_.data() + (at - chunk_begin), size_t(take));
    }
    at += take, target += take;
  }
}

void SavedTensorReader::read(const SavedMap& saved, const affine::Plan& plan, void* target) {
  // In source order: consecutive pieces of one buffer share their edge chunks.
  std::vector<size_t> order(plan.segments.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &x = plan.segments[a], &y = plan.segments[b];
    return std::tie(x.source_rank, x.source_offset) < std::tie(y.source_rank, y.source_offset);
  });
  const int64_t es = affine::element_size(saved.map.dtype);
  auto* out = static_cast<char*>(target);
  for (size_t i : order) {
    const auto& seg = plan.segments[i];
    const auto src = source(saved, seg.source_rank);
    for_each_run(seg, [&](int64_t s, int64_t t, int64_t n) { copy_run(saved, src, s, out + t * es, n); });
  }
}

}  // namespace tessera::checkpoint
