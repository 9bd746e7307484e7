#include "core/affine/detail/strided_region.h"

#include <algorithm>
#include <numeric>

#include "core/affine/errors.h"

namespace tessera::affine::detail {
namespace {

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// Does canonical region r (axes from `axis` on, at `base`) touch any address in [lo, hi)?
bool hits(const StridedRegion& r, int axis, int64_t base, int64_t lo, int64_t hi, const std::vector<int64_t>& span) {
  if (axis == r.extents.size()) return base < hi && lo < base + r.width;
  const int64_t s = r.strides[axis];
  const int64_t e = r.extents[axis];
  // slice i touches [base + i*s, base + i*s + span[axis+1]); need it to meet [lo, hi).
  int64_t i_min = floor_div(lo - base - span[axis + 1], s) + 1;
  int64_t i_max = floor_div(hi - 1 - base, s);
  i_min = std::max<int64_t>(i_min, 0);
  i_max = std::min<int64_t>(i_max, e - 1);
  for (int64_t i = i_min; i <= i_max; ++i) {
    if (hits(r, axis + 1, base + i * s, lo, hi, span)) return true;
  }
  return false;
}

// span[k] = extent of addresses touched by one index of axes < k, i.e. by axes k.. plus width.
std::vector<int64_t> spans(const StridedRegion& r) {
  std::vector<int64_t> span(r.extents.size() + 1);
  span[r.extents.size()] = r.width;
  for (int k = r.extents.size() - 1; k >= 0; --k) span[k] = (r.extents[k] - 1) * r.strides[k] + span[k + 1];
  return span;
}

int64_t run_count(const StridedRegion& r) { return r.extents.product(); }

// Calls visit(lo, hi) for every contiguous run of canonical region r; stops when visit returns true.
template <class Visit>
bool for_each_run(const StridedRegion& r, int axis, int64_t base, Visit& visit) {
  if (axis == r.extents.size()) return visit(base, base + r.width);
  for (int64_t i = 0; i < r.extents[axis]; ++i) {
    if (for_each_run(r, axis + 1, base + i * r.strides[axis], visit)) return true;
  }
  return false;
}

}  // namespace

bool StridedRegion::empty() const {
  if (width <= 0) return true;
  for (int k = 0; k < extents.size(); ++k) {
    if (extents[k] <= 0) return true;
  }
  return false;
}

int64_t StridedRegion::last() const {
  if (empty()) return base;
  int64_t end = base + width;
  for (int k = 0; k < extents.size(); ++k) end += (extents[k] - 1) * strides[k];
  return end;
}

StridedRegion canonical(const StridedRegion& region) {
  StridedRegion out;
  out.base = region.base;
  out.width = region.width;
  std::vector<std::pair<int64_t, int64_t>> axes;  // (stride, extent)
  for (int k = 0; k < region.extents.size(); ++k) {
    if (region.extents[k] != 1) axes.emplace_back(region.strides[k], region.extents[k]);
  }
  std::sort(axes.begin(), axes.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  // Fold innermost axes contiguous with the width.
  while (!axes.empty() && axes.back().first == out.width) {
    out.width *= axes.back().second;
    axes.pop_back();
  }
  // Merge neighbours: outer stride == inner stride * inner extent.
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (auto it = axes.rbegin(); it != axes.rend(); ++it) {  // innermost first
    if (!merged.empty() && it->first == merged.back().first * merged.back().second) {
      merged.back().second *= it->second;
    } else {
      merged.push_back(*it);
    }
  }
  for (auto it = merged.rbegin(); it != merged.rend(); ++it) {
    out.strides.push_back(it->first);
    out.extents.push_back(it->second);
  }
  return out;
}

bool regions_overlap(const StridedRegion& a_in, const StridedRegion& b_in, int64_t budget) {
  if (a_in.empty() || b_in.empty()) return false;
  if (a_in.last() <= b_in.first() || b_in.last() <= a_in.first()) return false;
  StridedRegion a = canonical(a_in);
  StridedRegion b = canonical(b_in);
  if (run_count(a) > run_count(b)) std::swap(a, b);
  if (run_count(a) > budget) {
    throw BudgetExceededError("checking two interleaved strided regions for a shared address needs " +
                              std::to_string(run_count(a)) + " run tests, over the budget of " +
                              std::to_string(budget));
  }
  const std::vector<int64_t> b_span = spans(b);
  auto visit = [&](int64_t lo, int64_t hi) { return hits(b, 0, b.base, lo, hi, b_span); };
  return for_each_run(a, 0, a.base, visit);
}

std::optional<std::pair<size_t, size_t>> find_overlap(const std::vector<StridedRegion>& regions, int64_t budget) {
  std::vector<size_t> order;
  order.reserve(regions.size());
  for (size_t i = 0; i < regions.size(); ++i) {
    if (!regions[i].empty()) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    if (regions[x].first() != regions[y].first()) return regions[x].first() < regions[y].first();
    return x < y;
  });
  std::vector<size_t> active;  // regions whose span may still reach later starts
  for (size_t i : order) {
    const int64_t start = regions[i].first();
    size_t kept = 0;
    for (size_t j : active) {
      if (regions[j].last() > start) active[kept++] = j;
    }
    active.resize(kept);
    for (size_t j : active) {
      if (regions_overlap(regions[j], regions[i], budget)) return std::make_pair(std::min(i, j), std::max(i, j));
    }
    active.push_back(i);
  }
  return std::nullopt;
}

}  // namespace tessera::affine::detail
