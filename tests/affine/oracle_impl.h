// Implementation of oracle.h (header-only; test code).
#pragma once

#include <sstream>
#include <stdexcept>

#include "core/affine/run_boxes.h"

namespace tessera::affine::testing {

inline bool PaddedBuffer::padding_intact() const {
  for (int64_t i = 0; i < kPad; ++i) {
    if (words[static_cast<size_t>(i)] != kSentinel) return false;
    if (words[static_cast<size_t>(kPad + elements + i)] != kSentinel) return false;
  }
  return true;
}

template <class Visit>
void for_each_element(const Dims& tensor_shape, const Piece& piece, Visit&& visit) {
  const Box& box = piece.box;
  if (box.is_empty()) return;
  const int ndim = box.ndim();
  Dims index = box.origin;
  for (;;) {
    visit(linear_index(tensor_shape, index), piece.address_of(index));
    int k = ndim - 1;
    for (; k >= 0; --k) {
      if (++index[k] < box.end(k)) break;
      index[k] = box.origin[k];
    }
    if (k < 0) break;
  }
}

inline PaddedBuffer padded(int64_t elements, uint32_t fill) {
  PaddedBuffer b;
  b.elements = elements;
  b.words.assign(static_cast<size_t>(elements + 2 * kPad), fill);
  for (int64_t i = 0; i < kPad; ++i) {
    b.words[static_cast<size_t>(i)] = kSentinel;
    b.words[static_cast<size_t>(kPad + elements + i)] = kSentinel;
  }
  return b;
}

inline RankBuffers make_source_buffers(const TensorMap& map, uint32_t fill) {
  RankBuffers out;
  for (const auto& [rank, storage] : map.ranks) {
    PaddedBuffer b = padded(storage.buffer_elements, fill);
    for (const auto& p : storage.pieces) {
      for_each_element(map.shape, p, [&](int64_t linear, int64_t address) {
        b.data()[address] = static_cast<uint32_t>(linear + 1);
      });
    }
    out.emplace(rank, std::move(b));
  }
  return out;
}

inline RankBuffers make_target_buffers(const TensorMap& map) {
  RankBuffers out;
  for (const auto& [rank, storage] : map.ranks) out.emplace(rank, padded(storage.buffer_elements, kNaN));
  return out;
}

inline std::vector<uint32_t> gather(const TensorMap& map, const RankBuffers& buffers) {
  std::vector<uint32_t> full(static_cast<size_t>(map.numel()), kNaN);
  std::vector<char> seen(full.size(), 0);
  for (const auto& [rank, storage] : map.ranks) {
    const PaddedBuffer& b = buffers.at(rank);
    for (const auto& p : storage.pieces) {
      for_each_element(map.shape, p, [&](int64_t linear, int64_t address) {
        const uint32_t v = b.data()[address];
        if (seen[static_cast<size_t>(linear)] && full[static_cast<size_t>(linear)] != v) {
          throw std::runtime_error("oracle: replicas disagree at element " + std::to_string(linear));
        }
        full[static_cast<size_t>(linear)] = v;
        seen[static_cast<size_t>(linear)] = 1;
      });
    }
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) throw std::runtime_error("oracle: element " + std::to_string(i) + " is held by no source rank");
  }
  return full;
}

inline RankBuffers scatter(const TensorMap& map, const std::vector<uint32_t>& full) {
  RankBuffers out = make_target_buffers(map);
  for (const auto& [rank, storage] : map.ranks) {
    PaddedBuffer& b = out.at(rank);
    for (const auto& p : storage.pieces) {
      for_each_element(map.shape, p, [&](int64_t linear, int64_t address) {
        b.data()[address] = full[static_cast<size_t>(linear)];
      });
    }
  }
  return out;
}

inline LocalTransfer bind_buffers(const Plan& plan, RankBuffers& sources, RankBuffers& targets) {
  LocalTransfer t;
  t.plan = &plan;
  for (auto& [rank, b] : sources) t.source_buffers[rank] = LocalBuffer{b.data(), b.elements, plan.dtype};
  for (auto& [rank, b] : targets) t.target_buffers[rank] = LocalBuffer{b.data(), b.elements, plan.dtype};
  return t;
}

inline std::string compare(const RankBuffers& actual, const RankBuffers& expected) {
  for (const auto& [rank, e] : expected) {
    const PaddedBuffer& a = actual.at(rank);
    if (!a.padding_intact()) return "target rank " + std::to_string(rank) + ": sentinel padding was overwritten";
    for (int64_t i = 0; i < e.elements; ++i) {
      if (a.data()[i] != e.data()[i]) {
        std::ostringstream os;
        os << "target rank " << rank << " element " << i << ": got 0x" << std::hex << a.data()[i] << ", expected 0x"
           << e.data()[i];
        return os.str();
      }
    }
  }
  return "";
}

inline std::string check_transfer(const TensorMap& target, const TensorMap& source, const Plan& plan,
                                  bool through_staging, int64_t staging_bytes) {
  RankBuffers sources = make_source_buffers(source);
  RankBuffers targets = make_target_buffers(target);
  const RankBuffers expected = scatter(target, gather(source, sources));
  LocalExecutorOptions options;
  options.through_staging = through_staging;
  options.staging_bytes = staging_bytes;
  execute_local({bind_buffers(plan, sources, targets)}, options);
  return compare(targets, expected);
}

}  // namespace tessera::affine::testing
