// optim::SplitStateStore (partial offload) against optim::MemoryStateStore (the oracle): the same
// AdamW kernel stepped through both, sub-group by sub-group, gives the same bits in every master
// and state, for flat groups wholly on the host, split between host and device, and wholly on the
// device; a split group's whole partitions, lent for a checkpoint and written into, are what the
// next steps use (and what a negative control without that write sees differ); the bytes of the
// two parts add up to the oracle's; parts that do not fit the sub-groups are refused.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include "core/error.h"
#include "core/optim/optimizer_kernel.h"
#include "core/optim/split_state_store.h"
#include "tests/optim/state_store_test_support.h"

using namespace tessera::optim;
using namespace tessera::optim::store_testing;

namespace {

// Three flat groups of 10,007, 3,001 and 5,000 elements in sub-groups of 1,000: 11 + 4 + 5.
Model three_groups() { return Model(1000, {10007, 3001, 5000}); }

// The first `host[g]` sub-groups of group g in the host part, the rest in the device part (both
// host memory here, in distinct buffers).
SplitStateStore split_store(const Model& m, const OptimizerKernel& k, const std::vector<int64_t>& host) {
  std::vector<SplitStateStore::Group> groups;
  for (size_t g = 0; g < m.partitions.size(); ++g) {
    SplitStateStore::Group group;
    group.sub_groups = m.sub_groups[g];
    group.host_sub_groups = host[g];
    const int64_t n = m.partitions[g].numel();
    const int64_t split = host[g] == 0 ? 0 : m.sub_groups[g][size_t(host[g] - 1)].second;
    if (split > 0) {
      group.host.master = m.partitions[g].narrow(0, 0, split).clone();
      group.host.states = k.initial_states(group.host.master);
    }
    if (split < n) {
      group.device.master = m.partitions[g].narrow(0, split, n - split).clone();
      group.device.states = k.initial_states(group.device.master);
    }
    groups.push_back(std::move(group));
  }
  return SplitStateStore(std::move(groups));
}

// Whether every master and state of the two stores has the same bits (expect_same's verdict as a value).
bool same_store(const StateStore& a, const StateStore& b, size_t groups) {
  bool same = true;
  for (size_t g = 0; g < groups; ++g) {
    same = same && same_bits(a.partition_master(int64_t(g)), b.partition_master(int64_t(g)));
    const auto sa = a.partition_states(int64_t(g)), sb = b.partition_states(int64_t(g));
    same = same && sa.size() == sb.size();
    for (size_t k = 0; same && k < sa.size(); ++k) same = same_bits(sa[k], sb[k]);
  }
  return same;
}

}  // namespace

TEST_CASE("A split store steps bit for bit as the memory store, its lent partitions written back", "[split_store]") {
  const Model m = three_groups();
  auto k = adamw();
  Workspace wa, wb;
  auto oracle_store = memory_store(m, *k);
  auto& oracle = *oracle_store;
  auto split = split_store(m, *k, {11, 2, 0});  // wholly host, split 2 | 2, wholly device
  CHECK(split.on_host(0, 10));
  CHECK(split.on_host(1, 1));
  CHECK_FALSE(split.on_host(1, 2));
  CHECK_FALSE(split.on_host(2, 0));
  for (int64_t n = 1; n <= 3; ++n) step(oracle, m, *k, n, wa), step(split, m, *k, n, wb);
  CHECK(same_store(oracle, split, 3));  // pages group 1 in

  // The bytes: both parts (and the paged-in copy of group 1, host memory too) against the oracle's.
  const int64_t group1 = 3001 * 4;
  CHECK(split.device_master_bytes() == (3001 - 2000) * 4 + 5000 * 4);
  CHECK(split.host_master_bytes() == 10007 * 4 + 2000 * 4 + group1);
  CHECK(split.host_state_bytes() + split.device_state_bytes() == oracle.state_bytes() + 2 * group1);

  // A checkpoint load writes into the lent partitions (across the split); the next step uses them.
  for (auto* store : {static_cast<StateStore*>(&oracle), static_cast<StateStore*>(&split)}) {
    store->partition_master(1).narrow(0, 1500, 1000).fill_(0.25);
    store->partition_states(1)[1].narrow(0, 1900, 200).fill_(0.5);
  }
  step(oracle, m, *k, 4, wa), step(split, m, *k, 4, wb);
  CHECK(split.host_master_bytes() == 10007 * 4 + 2000 * 4);  // written back and freed
  CHECK(same_store(oracle, split, 3));
  CHECK(split.device_masters().size() == 2);
  CHECK(split.device_states().size() == 4);
}

TEST_CASE("Negative control: a write into a lent partition of one store only is seen", "[split_store]") {
  const Model m = three_groups();
  auto k = adamw();
  Workspace wa, wb;
  auto oracle_store = memory_store(m, *k);
  auto& oracle = *oracle_store;
  auto split = split_store(m, *k, {11, 2, 0});
  split.partition_states(1)[0].narrow(0, 2500, 1).fill_(1.0);  // in the device part of the split group
  step(oracle, m, *k, 1, wa), step(split, m, *k, 1, wb);
  CHECK_FALSE(same_store(oracle, split, 3));
}

TEST_CASE("A split store refuses parts that do not fit its sub-groups", "[split_store]") {
  const Model m = three_groups();
  auto k = adamw();
  auto group = [&](int64_t host) {
    std::vector<SplitStateStore::Group> groups(1);
    groups[0].sub_groups = m.sub_groups[1];
    groups[0].host_sub_groups = host;
    groups[0].host.master = m.partitions[1].narrow(0, 0, 2000).clone();
    groups[0].host.states = k->initial_states(groups[0].host.master);
    groups[0].device.master = m.partitions[1].narrow(0, 2000, 1001).clone();
    groups[0].device.states = k->initial_states(groups[0].device.master);
    return groups;
  };
  CHECK_NOTHROW(SplitStateStore(group(2)));
  CHECK_THROWS_WITH(SplitStateStore(group(3)), Catch::Contains("flat group 0") && Catch::Contains("host part"));
  CHECK_THROWS_WITH(SplitStateStore(group(5)), Catch::Contains("5 host sub-groups of 4"));
  auto no_master = group(2);
  no_master[0].device.master = torch::Tensor();
  CHECK_THROWS_WITH(SplitStateStore(std::move(no_master)), Catch::Contains("masters differ in kind"));
  auto gap = group(2);
  gap[0].sub_groups[1].first += 1;
  CHECK_THROWS_WITH(SplitStateStore(std::move(gap)), Catch::Contains("not contiguous"));
}
