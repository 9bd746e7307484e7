#include "actors/final_sub_groups.h"

#include <algorithm>

namespace tessera::actors {
namespace {

// Calls f(s, elements) for each sub-group s that [begin, end) overlaps.
template <class F>
void overlaps(const std::vector<FinalSubGroups::Range>& subs, int64_t begin, int64_t end, F&& f) {
  auto it = std::upper_bound(subs.begin(), subs.end(), begin,
                             [](int64_t x, const FinalSubGroups::Range& r) { return x < r.second; });
  for (; it != subs.end() && it->first < end; ++it) {
    const int64_t n = std::min(end, it->second) - std::max(begin, it->first);
    if (n > 0) f(int64_t(it - subs.begin()), n);
  }
}

}  // namespace

FinalSubGroups::FinalSubGroups(std::vector<std::vector<Range>> sub_groups, const std::vector<std::vector<Range>>& written)
    : sub_groups_(std::move(sub_groups)) {
  for (size_t g = 0; g < sub_groups_.size(); ++g) {
    expected_.emplace_back(sub_groups_[g].size(), 0);
    if (g < written.size())
      for (const auto& [b, e] : written[g])
        overlaps(sub_groups_[g], b, e, [&](int64_t s, int64_t n) { expected_[g][size_t(s)] += n; });
  }
  start();
}

void FinalSubGroups::start() {
  written_.clear();
  final_.clear();
  for (const auto& e : expected_) {
    written_.emplace_back(e.size(), 0);
    final_.emplace_back(e.size(), 0);
  }
  exceeded_ = false;
}

void FinalSubGroups::cover(int64_t g, int64_t begin, int64_t length, std::vector<Key>& out) {
  if (g < 0 || size_t(g) >= sub_groups_.size() || length <= 0) return;
  overlaps(sub_groups_[size_t(g)], begin, begin + length, [&](int64_t s, int64_t n) {
    auto& w = written_[size_t(g)][size_t(s)];
    w += n;
    if (w > expected_[size_t(g)][size_t(s)]) exceeded_ = true;
  });
  if (exceeded_) return;
  overlaps(sub_groups_[size_t(g)], begin, begin + length, [&](int64_t s, int64_t) {
    auto& f = final_[size_t(g)][size_t(s)];
    if (!f && expected_[size_t(g)][size_t(s)] > 0 && written_[size_t(g)][size_t(s)] == expected_[size_t(g)][size_t(s)]) {
      f = 1;
      out.push_back({g, s});
    }
  });
}

void FinalSubGroups::settle(std::vector<Key>& out) {
  for (size_t g = 0; g < final_.size(); ++g)
    for (size_t s = 0; s < final_[g].size(); ++s)
      if (!final_[g][s]) {
        final_[g][s] = 1;
        out.push_back({int64_t(g), int64_t(s)});
      }
}

int64_t FinalSubGroups::count() const {
  int64_t n = 0;
  for (const auto& s : sub_groups_) n += int64_t(s.size());
  return n;
}

}  // namespace tessera::actors
