// Test oracle for affine transfers: gather everything, then scatter, element by element.
//
// Buffers hold uint32 bit patterns (the maps say f32; comparisons are bitwise). Source buffers are
// filled from a reference tensor whose element i has the value i + 1 (so nothing is 0 or NaN); target
// buffers start as NaN (0x7fc00000) with kPad sentinel words (0xDEADBEEF) on both sides. The expected
// targets are cut, element by element, from the tensor rebuilt from the source buffers; holes in the
// target buffers must stay NaN and the sentinels must survive.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/affine/affine_map.h"
#include "core/affine/local_executor.h"
#include "core/affine/plan.h"

namespace tessera::affine::testing {

inline constexpr uint32_t kNaN = 0x7fc00000u;
inline constexpr uint32_t kSentinel = 0xDEADBEEFu;
inline constexpr int64_t kPad = 7;

// One rank's buffer with sentinel padding around it.
struct PaddedBuffer {
  std::vector<uint32_t> words;  // kPad + elements + kPad
  int64_t elements = 0;
  uint32_t* data() { return words.data() + kPad; }
  const uint32_t* data() const { return words.data() + kPad; }
  bool padding_intact() const;
};

using RankBuffers = std::map<int, PaddedBuffer>;

// Calls visit(linear_index, address) for every element of the piece.
template <class Visit>
void for_each_element(const Dims& tensor_shape, const Piece& piece, Visit&& visit);

// Buffers of `map` holding reference values (element i -> i + 1); holes are `fill`.
RankBuffers make_source_buffers(const TensorMap& map, uint32_t fill = 0x11111111u);
// NaN-filled buffers for `map`.
RankBuffers make_target_buffers(const TensorMap& map);
// Rebuilds the full tensor from source buffers (replicas must agree; every element must be held).
std::vector<uint32_t> gather(const TensorMap& map, const RankBuffers& buffers);
// Expected target buffers: NaN everywhere except the elements the map describes, cut from `full`.
RankBuffers scatter(const TensorMap& map, const std::vector<uint32_t>& full);

LocalTransfer bind_buffers(const Plan& plan, RankBuffers& sources, RankBuffers& targets);

// Plans target <- source, executes it on fresh buffers and compares with the oracle. Returns "" on
// success, else a description of the first difference.
std::string check_transfer(const TensorMap& target, const TensorMap& source, const Plan& plan,
                           bool through_staging = false, int64_t staging_bytes = int64_t{64} << 20);

// Compares executed target buffers with expected ones (values, holes and padding).
std::string compare(const RankBuffers& actual, const RankBuffers& expected);

}  // namespace tessera::affine::testing

#include "oracle_impl.h"
