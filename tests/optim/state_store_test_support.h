// What the state store tests share (core/optim): the AdamW kernel they step, a model of flat
// partitions cut into sub-groups, the in-memory store (the oracle), one optimizer step through a
// store in the optimizer-shard's order, and bitwise comparisons.
#pragma once

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "core/optim/optimizer_kernel.h"
#include "core/optim/state_store.h"

namespace tessera::optim::store_testing {

inline std::unique_ptr<OptimizerKernel> adamw() {
  OptimizerOptions o;
  o.kind = OptimizerKind::AdamW;
  o.lr = 1e-2, o.weight_decay = 0.01;
  return make_optimizer_kernel(o);
}

// Two flat groups, partitions of 10,007 and 3,001 elements, cut into sub-groups of `sub`.
struct Model {
  std::vector<at::Tensor> partitions;
  std::vector<std::vector<std::pair<int64_t, int64_t>>> sub_groups;
  explicit Model(int64_t sub, std::vector<int64_t> sizes = {10007, 3001}) {
    at::manual_seed(3);
    for (int64_t n : sizes) {
      partitions.push_back(at::randn({n}));
      std::vector<std::pair<int64_t, int64_t>> cuts;
      for (int64_t b = 0; b < n; b += sub) cuts.push_back({b, std::min(n, b + sub)});
      sub_groups.push_back(cuts);
    }
  }
};

inline std::unique_ptr<MemoryStateStore> memory_store(const Model& m, const OptimizerKernel& k) {
  std::vector<MemoryStateStore::Group> groups;
  for (size_t g = 0; g < m.partitions.size(); ++g) {
    MemoryStateStore::Group group;
    group.master = m.partitions[g].clone();
    group.states = k.initial_states(group.master);
    group.sub_groups = m.sub_groups[g];
    groups.push_back(std::move(group));
  }
  return std::make_unique<MemoryStateStore>(std::move(groups));
}

inline at::Tensor gradient(int64_t step, int64_t g, int64_t n) {
  return at::randn({n}, at::TensorOptions().dtype(at::kFloat)).mul_(0.1).add_(double(step + g) * 1e-3);
}

// One optimizer step through a store, in the optimizer-shard's order: acquire, step, release
// (the NVMe store holds the previous record until the next is stepped, as the shard does).
inline void step(StateStore& store, const Model& m, const OptimizerKernel& k, int64_t number, Workspace& ws) {
  at::manual_seed(uint64_t(100 + number));
  for (size_t g = 0; g < m.sub_groups.size(); ++g) {
    const auto grad = gradient(number, int64_t(g), m.partitions[g].numel());
    for (size_t s = 0; s < m.sub_groups[g].size(); ++s) {
      const auto [b, e] = m.sub_groups[g][s];
      auto state = store.acquire(int64_t(g), int64_t(s));
      k.step(state.master, grad.narrow(0, b, e - b), state.states, number, k.default_hyperparameters(), ws);
      store.release(int64_t(g), int64_t(s));
    }
  }
}

inline bool same_bits(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && std::memcmp(a.data_ptr(), b.data_ptr(), size_t(a.numel() * a.element_size())) == 0;
}

inline void expect_same(const StateStore& a, const StateStore& b, size_t groups) {
  for (size_t g = 0; g < groups; ++g) {
    INFO("flat group " << g);
    CHECK(same_bits(a.partition_master(int64_t(g)), b.partition_master(int64_t(g))));
    const auto sa = a.partition_states(int64_t(g)), sb = b.partition_states(int64_t(g));
    REQUIRE(sa.size() == sb.size());
    for (size_t k = 0; k < sa.size(); ++k) CHECK(same_bits(sa[k], sb[k]));
  }
}

}  // namespace tessera::optim::store_testing
