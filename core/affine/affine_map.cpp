#include "core/affine/affine_map.h"

#include <algorithm>
#include <tuple>

namespace tessera::affine {

int64_t Piece::address_of(const Dims& index) const {
  int64_t address = offset;
  for (int k = 0; k < box.ndim(); ++k) address += (index[k] - box.origin[k]) * strides[k];
  return address;
}

int64_t Piece::last_address() const {
  int64_t address = offset;
  for (int k = 0; k < box.ndim(); ++k) {
    if (box.shape[k] > 1) address += (box.shape[k] - 1) * strides[k];
  }
  return address;
}

bool operator==(const Piece& a, const Piece& b) {
  return a.box == b.box && a.offset == b.offset && a.strides == b.strides && a.holders == b.holders;
}

bool operator==(const RankStorage& a, const RankStorage& b) {
  return a.buffer_elements == b.buffer_elements && a.buffer_shape == b.buffer_shape && a.pieces == b.pieces;
}

int64_t TensorMap::piece_count() const {
  int64_t n = 0;
  for (const auto& [rank, storage] : ranks) n += static_cast<int64_t>(storage.pieces.size());
  return n;
}

bool operator==(const TensorMap& a, const TensorMap& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.ranks == b.ranks;
}

std::string describe(const TensorMap& map) { return "tensor '" + map.name + "'"; }

void assign_holders_by_box(TensorMap& map) {
  std::vector<std::tuple<Box, int, Piece*>> entries;
  for (auto& [rank, storage] : map.ranks) {
    for (auto& piece : storage.pieces) entries.emplace_back(piece.box, rank, &piece);
  }
  std::sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
    if (std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) < std::get<0>(b);
    return std::get<1>(a) < std::get<1>(b);
  });
  for (size_t i = 0; i < entries.size();) {
    size_t j = i;
    std::vector<int> holders;
    while (j < entries.size() && std::get<0>(entries[j]) == std::get<0>(entries[i])) {
      if (holders.empty() || holders.back() != std::get<1>(entries[j])) holders.push_back(std::get<1>(entries[j]));
      ++j;
    }
    for (size_t k = i; k < j; ++k) std::get<2>(entries[k])->holders = holders;
    i = j;
  }
}

}  // namespace tessera::affine
