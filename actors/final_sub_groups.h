// FinalSubGroups: which sub-groups of this rank's gradient partitions hold their final values in
// the current backward, so that an offloaded optimizer can update them while backward still runs
// (tessera.offload.optimizer_during_backward). The gradient-reducer tells it each range one of
// this backward's reductions finished writing; a sub-group is final when every range the plan
// says a backward writes into it has been written (stage 2: the buckets this rank owns; stage 3:
// this rank's piece of every segment). Elements no reduction writes (padding) need nothing.
// Counting is by elements, so it relies on each range being written once per backward, which the
// plan guarantees (stage 2 issues each bucket once; stage 3 stages each segment's chunks once).
// Writes beyond what the plan expects stop every early answer for the rest of the backward: the
// sub-groups not final by then wait for settle().
//
// Example: sub-groups [0,1000) [1000,2000); the owned buckets write [0,600) [600,1600) [1600,2000):
// after the second bucket finishes, sub-group 0 is final; after the third, sub-group 1.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace tessera::actors {

class FinalSubGroups {
 public:
  using Range = std::pair<int64_t, int64_t>;  // [begin, end), partition-relative
  struct Key {
    int64_t group = 0;
    int64_t sub = 0;
  };

  FinalSubGroups() = default;
  // Per flat group: its sub-groups (ascending tiles), and the ranges one backward writes.
  FinalSubGroups(std::vector<std::vector<Range>> sub_groups, const std::vector<std::vector<Range>>& written);

  void start();  // a backward starts: nothing is final
  // One of this backward's reductions wrote [begin, begin + length) of group g's partition:
  // appends the sub-groups that became final.
  void cover(int64_t g, int64_t begin, int64_t length, std::vector<Key>& out);
  // Every reduction of the backward has finished: appends every sub-group not final yet, in order.
  void settle(std::vector<Key>& out);
  int64_t count() const;  // sub-groups of every group
  bool exceeded() const { return exceeded_; }

 private:
  std::vector<std::vector<Range>> sub_groups_;
  std::vector<std::vector<int64_t>> expected_, written_;  // per group, per sub-group: elements
  std::vector<std::vector<char>> final_;
  bool exceeded_ = false;
};

}  // namespace tessera::actors
