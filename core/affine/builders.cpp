#include "core/affine/builders.h"

#include <numeric>

#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

struct Slice {
  int64_t start;   // index along dim in the tensor
  int64_t extent;  // along dim
};

void check_dim(const TensorInfo& info, int dim) {
  if (dim < 0 || dim >= info.shape.size()) {
    throw InvalidMapError("tensor '" + info.name + "': partition axis " + std::to_string(dim) + " is not an axis of " +
                          to_string(info.shape));
  }
}

// Rank r's shard concatenates slices[r] along dim.
TensorMap from_slices(const TensorInfo& info, int dim, const std::vector<std::vector<Slice>>& slices) {
  TensorMap map;
  map.name = info.name;
  map.dtype = info.dtype;
  map.shape = info.shape;
  for (size_t r = 0; r < slices.size(); ++r) {
    Dims shard = info.shape;
    shard[dim] = 0;
    for (const auto& s : slices[r]) shard[dim] += s.extent;
    const Dims strides = row_major_strides(shard);
    RankStorage storage;
    storage.buffer_shape = shard;
    storage.buffer_elements = shard.product();
    int64_t at = 0;
    for (const auto& s : slices[r]) {
      Piece p;
      p.box = Box::whole(info.shape);
      p.box.origin[dim] = s.start;
      p.box.shape[dim] = s.extent;
      p.offset = at * strides[dim];
      p.strides = strides;
      p.holders = {static_cast<int>(r)};
      storage.pieces.push_back(p);
      at += s.extent;
    }
    map.ranks[static_cast<int>(r)] = std::move(storage);
  }
  assign_holders_by_box(map);
  return map;
}

void check_sum(const TensorInfo& info, const std::vector<int64_t>& widths, int64_t size, const std::string& what) {
  int64_t sum = 0;
  for (int64_t w : widths) {
    if (w < 0) throw InvalidMapError("tensor '" + info.name + "': negative width in " + what);
    sum += w;
  }
  if (sum != size) {
    throw InvalidMapError("tensor '" + info.name + "': widths of " + what + " sum to " + std::to_string(sum) +
                          " and do not account for its " + std::to_string(size) + " indices");
  }
}

}  // namespace

std::vector<int64_t> even_split_sizes(int64_t total, int parts) {
  if (parts <= 0) throw InvalidMapError("cannot split into " + std::to_string(parts) + " parts");
  std::vector<int64_t> sizes(static_cast<size_t>(parts), total / parts);
  for (int64_t r = 0; r < total % parts; ++r) ++sizes[static_cast<size_t>(r)];
  return sizes;
}

TensorMap replicated(const TensorInfo& info, int degree) {
  if (degree <= 0) throw InvalidMapError("tensor '" + info.name + "': replication degree " + std::to_string(degree));
  TensorMap map;
  map.name = info.name;
  map.dtype = info.dtype;
  map.shape = info.shape;
  std::vector<int> all(static_cast<size_t>(degree));
  std::iota(all.begin(), all.end(), 0);
  for (int r = 0; r < degree; ++r) {
    RankStorage storage;
    storage.buffer_shape = info.shape;
    storage.buffer_elements = info.shape.product();
    storage.pieces.push_back(Piece{Box::whole(info.shape), 0, row_major_strides(info.shape), all});
    map.ranks[r] = std::move(storage);
  }
  return map;
}

TensorMap contiguous_split(const TensorInfo& info, int dim, const std::vector<int64_t>& sizes) {
  check_dim(info, dim);
  check_sum(info, sizes, info.shape[dim], "the split along axis " + std::to_string(dim));
  std::vector<std::vector<Slice>> slices(sizes.size());
  int64_t at = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    slices[r].push_back(Slice{at, sizes[r]});
    at += sizes[r];
  }
  return from_slices(info, dim, slices);
}

TensorMap sub_param_split(const TensorInfo& info, int dim, const std::vector<int64_t>& sub_sizes,
                          const std::vector<std::vector<int64_t>>& widths) {
  check_dim(info, dim);
  check_sum(info, sub_sizes, info.shape[dim], "the sub-parameters");
  if (widths.size() != sub_sizes.size() || widths.empty()) {
    throw InvalidMapError("tensor '" + info.name + "': " + std::to_string(widths.size()) + " width lists for " +
                          std::to_string(sub_sizes.size()) + " sub-parameters");
  }
  const size_t degree = widths.front().size();
  std::vector<std::vector<Slice>> slices(degree);
  int64_t sub_start = 0;
  for (size_t i = 0; i < sub_sizes.size(); ++i) {
    if (widths[i].size() != degree) {
      throw InvalidMapError("tensor '" + info.name + "': sub-parameter " + std::to_string(i) + " has " +
                            std::to_string(widths[i].size()) + " widths for " + std::to_string(degree) + " ranks");
    }
    check_sum(info, widths[i], sub_sizes[i], "sub-parameter " + std::to_string(i));
    int64_t at = sub_start;
    for (size_t r = 0; r < degree; ++r) {
      slices[r].push_back(Slice{at, widths[i][r]});
      at += widths[i][r];
    }
    sub_start += sub_sizes[i];
  }
  return from_slices(info, dim, slices);
}

TensorMap sub_param_split_even(const TensorInfo& info, int dim, const std::vector<int64_t>& sub_sizes, int degree) {
  std::vector<std::vector<int64_t>> widths;
  for (int64_t size : sub_sizes) widths.push_back(even_split_sizes(size, degree));
  return sub_param_split(info, dim, sub_sizes, widths);
}

TensorMap segmented(const TensorInfo& info, int dim, const std::vector<LayoutSegment>& segments, int degree) {
  check_dim(info, dim);
  if (degree <= 0) throw InvalidMapError("tensor '" + info.name + "': degree " + std::to_string(degree));
  std::vector<int64_t> sizes;
  for (const auto& s : segments) sizes.push_back(s.size);
  check_sum(info, sizes, info.shape[dim], "the segments");
  std::vector<std::vector<Slice>> slices(static_cast<size_t>(degree));
  int64_t start = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    const auto& seg = segments[i];
    if (seg.replicated) {
      for (auto& rank_slices : slices) rank_slices.push_back(Slice{start, seg.size});
    } else {
      if (static_cast<int>(seg.widths.size()) != degree) {
        throw InvalidMapError("tensor '" + info.name + "': segment " + std::to_string(i) + " has " +
                              std::to_string(seg.widths.size()) + " widths for " + std::to_string(degree) + " ranks");
      }
      check_sum(info, seg.widths, seg.size, "segment " + std::to_string(i));
      int64_t at = start;
      for (int r = 0; r < degree; ++r) {
        slices[static_cast<size_t>(r)].push_back(Slice{at, seg.widths[static_cast<size_t>(r)]});
        at += seg.widths[static_cast<size_t>(r)];
      }
    }
    start += seg.size;
  }
  return from_slices(info, dim, slices);
}

TensorMap block_gather(const TensorInfo& info, int dim, int64_t block_size,
                       const std::vector<std::vector<int64_t>>& block_ids_by_rank) {
  check_dim(info, dim);
  if (block_size <= 0 || info.shape[dim] % block_size != 0) {
    throw InvalidMapError("tensor '" + info.name + "': block size " + std::to_string(block_size) +
                          " does not divide axis " + std::to_string(dim) + " of " + to_string(info.shape));
  }
  const int64_t blocks = info.shape[dim] / block_size;
  std::vector<std::vector<Slice>> slices(block_ids_by_rank.size());
  for (size_t r = 0; r < block_ids_by_rank.size(); ++r) {
    for (int64_t id : block_ids_by_rank[r]) {
      if (id < 0 || id >= blocks) {
        throw InvalidMapError("tensor '" + info.name + "': rank " + std::to_string(r) + " names block " +
                              std::to_string(id) + " of " + std::to_string(blocks));
      }
      auto& list = slices[r];
      if (!list.empty() && list.back().start + list.back().extent == id * block_size) {
        list.back().extent += block_size;
      } else {
        list.push_back(Slice{id * block_size, block_size});
      }
    }
  }
  return from_slices(info, dim, slices);
}

}  // namespace tessera::affine
