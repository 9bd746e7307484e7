#include "core/affine/zero_storage.h"

#include <algorithm>

#include "core/affine/errors.h"
#include "core/affine/run_boxes.h"

namespace tessera::affine {
namespace {

void check_dp(int dp) {
  if (dp <= 0) throw InvalidMapError("a data-parallel group of " + std::to_string(dp) + " ranks");
}

TensorMap empty_map(const TensorInfo& info, int dp, int64_t buffer_elements) {
  TensorMap map;
  map.name = info.name;
  map.dtype = info.dtype;
  map.shape = info.shape;
  for (int r = 0; r < dp; ++r) map.ranks[r].buffer_elements = buffer_elements;
  return map;
}

// Elements [begin, end) of the tensor (row-major) are stored contiguously from `address` on `rank`.
void add_run(TensorMap& map, int rank, int64_t begin, int64_t end, int64_t address) {
  const Dims strides = row_major_strides(map.shape);
  for (const Box& box : run_boxes(map.shape, begin, end)) {
    map.ranks[rank].pieces.push_back(
        Piece{box, address + linear_index(map.shape, box.origin) - begin, strides, {rank}});
  }
}

}  // namespace

TensorMap stored_runs(const TensorInfo& tensor, const std::vector<StoredRun>& runs,
                      const std::map<int, int64_t>& buffer_elements) {
  TensorMap map;
  map.name = tensor.name;
  map.dtype = tensor.dtype;
  map.shape = tensor.shape;
  for (const auto& [rank, elements] : buffer_elements) map.ranks[rank].buffer_elements = elements;
  for (const auto& run : runs) {
    if (!buffer_elements.count(run.rank))
      throw InvalidMapError(describe(map) + ": a run on rank " + std::to_string(run.rank) + " that has no buffer");
    if (run.begin < run.end) add_run(map, run.rank, run.begin, run.end, run.address);
  }
  assign_holders_by_box(map);
  return map;
}

int64_t zero12_partition_elements(int64_t total, int dp, int64_t alignment) {
  check_dp(dp);
  if (alignment <= 0) throw InvalidMapError("ZeRO flat-group alignment " + std::to_string(alignment));
  if (total < 0) throw InvalidMapError("ZeRO flat group of " + std::to_string(total) + " elements");
  const int64_t unit = dp * alignment;
  return (total + unit - 1) / unit * unit / dp;
}

std::vector<TensorMap> zero12_flat_group(const std::vector<TensorInfo>& tensors, int dp, int64_t alignment) {
  int64_t total = 0;
  for (const auto& t : tensors) total += t.shape.product();
  const int64_t partition = zero12_partition_elements(total, dp, alignment);
  std::vector<TensorMap> maps;
  int64_t start = 0;  // of the tensor in the flat group
  for (const auto& t : tensors) {
    TensorMap map = empty_map(t, dp, partition);
    const int64_t numel = t.shape.product();
    for (int r = 0; r < dp; ++r) {
      const int64_t lo = std::max(start, r * partition);
      const int64_t hi = std::min(start + numel, (r + 1) * partition);
      if (lo < hi) add_run(map, r, lo - start, hi - start, lo - r * partition);
    }
    maps.push_back(std::move(map));
    start += numel;
  }
  return maps;
}

int64_t zero3_partition_elements(int64_t numel, int dp) {
  check_dp(dp);
  return (numel + dp - 1) / dp;
}

TensorMap zero3_partition(const TensorInfo& tensor, int dp) {
  const int64_t numel = tensor.shape.product();
  const int64_t partition = zero3_partition_elements(numel, dp);
  TensorMap map = empty_map(tensor, dp, partition);
  for (int r = 0; r < dp; ++r) {
    const int64_t lo = std::min(numel, r * partition);
    const int64_t hi = std::min(numel, (r + 1) * partition);
    if (lo < hi) add_run(map, r, lo, hi, 0);
  }
  return map;
}

std::vector<TensorMap> zero3_flat_group(const std::vector<TensorInfo>& tensors, int dp) {
  check_dp(dp);
  int64_t buffer = 0;
  for (const auto& t : tensors) buffer += zero3_partition_elements(t.shape.product(), dp);
  std::vector<TensorMap> maps;
  int64_t base = 0;  // of the tensor's partition in each rank's buffer
  for (const auto& t : tensors) {
    const int64_t numel = t.shape.product();
    const int64_t partition = zero3_partition_elements(numel, dp);
    TensorMap map = empty_map(t, dp, buffer);
    for (int r = 0; r < dp; ++r) {
      const int64_t lo = std::min(numel, r * partition);
      const int64_t hi = std::min(numel, (r + 1) * partition);
      if (lo < hi) add_run(map, r, lo, hi, base);
    }
    maps.push_back(std::move(map));
    base += partition;
  }
  return maps;
}

}  // namespace tessera::affine
