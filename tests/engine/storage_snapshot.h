// Copies of an engine's storage buffers (storage_maps().buffers: weights, masters, every
// optimizer state) and their comparison byte for byte, for the tests that demand bitwise equality
// across a change of layout, offload or a checkpoint round trip.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <string>
#include <vector>

#include "actors/engine/engine.h"

namespace tessera::engine_testing {

inline std::map<std::string, at::Tensor> buffers(const Engine& engine) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [key, t] : engine.storage_maps().buffers) out[key] = t.clone();
  return out;
}

// The buffers whose bytes, dtype or size differ, or that one side lacks (NaN bit patterns compare
// equal through the bytes).
inline std::vector<std::string> differing(const std::map<std::string, at::Tensor>& a,
                                          const std::map<std::string, at::Tensor>& b) {
  std::vector<std::string> out;
  for (const auto& [key, t] : a) {
    const auto it = b.find(key);
    if (it == b.end() || t.scalar_type() != it->second.scalar_type() || t.numel() != it->second.numel() ||
        !at::equal(t.contiguous().view(at::kByte), it->second.contiguous().view(at::kByte)))
      out.push_back(key);
  }
  if (a.size() != b.size()) out.push_back("(" + std::to_string(a.size()) + " vs " + std::to_string(b.size()) + " buffers)");
  return out;
}

}  // namespace tessera::engine_testing
