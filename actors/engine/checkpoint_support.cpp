#include "actors/engine/checkpoint_support.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <random>
#include <set>

#include "core/affine/serialize.h"
#include "core/error.h"
#include "transport/communicator.h"

namespace tessera::checkpoint_support {

std::vector<std::string> all_gather_strings(transport::Communicator* comm, const std::string& mine) {
  if (!comm || comm->size() == 1) return {mine};
  const int n = comm->size();
  auto length = at::full({1}, int64_t(mine.size()), at::kLong);
  auto lengths = at::empty({n}, at::kLong);
  comm->all_gather(length, lengths)->wait();
  int64_t longest = 0;
  for (int r = 0; r < n; ++r) longest = std::max(longest, lengths[r].item<int64_t>());
  auto bytes = at::zeros({std::max<int64_t>(longest, 1)}, at::kByte);
  std::memcpy(bytes.data_ptr(), mine.data(), mine.size());
  auto all = at::empty({n * bytes.numel()}, at::kByte);
  comm->all_gather(bytes, all)->wait();
  std::vector<std::string> out;
  const auto* p = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < n; ++r) out.emplace_back(p + r * bytes.numel(), size_t(lengths[r].item<int64_t>()));
  return out;
}

std::string nonce() {
  std::random_device device;
  std::mt19937_64 generator((uint64_t(device()) << 32) ^ device() ^
                            uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  return affine::hex_digest(generator()).substr(0, 12);
}

std::string first_error(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) return "rank " + std::to_string(r) + ": " + errors[r];
  return "";
}

checkpoint::RankAliases find_aliases(const EngineStorage& storage) {
  checkpoint::RankAliases out;
  for (const auto& [key, t] : storage.buffers) {
    if (!t.defined() || t.numel() == 0) continue;
    const auto* begin = static_cast<const char*>(t.data_ptr());
    const auto* end = begin + t.numel() * t.element_size();
    for (const auto& [other, u] : storage.buffers) {
      if (other == key || !u.defined() || u.scalar_type() != t.scalar_type() || u.numel() < t.numel()) continue;
      const auto* ubegin = static_cast<const char*>(u.data_ptr());
      const auto* uend = ubegin + u.numel() * u.element_size();
      if (begin < ubegin || end > uend) continue;
      // Two views of one range: the weights ("param/...") are the base, else the smaller key.
      if (u.numel() == t.numel() && begin == ubegin) {
        const bool key_is_param = key.rfind("param/", 0) == 0, other_is_param = other.rfind("param/", 0) == 0;
        if (key_is_param || (!other_is_param && other > key)) continue;
      }
      out[key] = {other, int64_t((begin - ubegin) / t.element_size())};
      break;
    }
  }
  return out;
}

std::vector<checkpoint::EngineMap> engine_maps(const EngineStorage& storage) {
  std::vector<checkpoint::EngineMap> out;
  for (const auto& m : storage.maps) out.push_back({m.kind, m.buffer, m.map});
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> frozen_parameters(torch::nn::Module& module,
                                                                  const std::vector<std::string>& stored) {
  const std::set<std::string> names(stored.begin(), stored.end());
  const auto params = module.named_parameters();
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : params)
    if (names.count(item.key())) seen.insert(item.value().unsafeGetTensorImpl());
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : params)
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace tessera::checkpoint_support
