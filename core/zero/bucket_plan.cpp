#include "core/zero/bucket_plan.h"

#include <algorithm>

#include "core/error.h"

namespace tessera::zero {
namespace {

// Parameters overlapping the flat range [begin, end), appended to `out`.
void params_in_range(const FlatGroupLayout& layout, int64_t begin, int64_t end, std::vector<int64_t>& out) {
  auto it = std::upper_bound(layout.params.begin(), layout.params.end(), begin,
                             [](int64_t b, const ParameterSlot& p) { return b < p.offset + p.numel; });
  for (; it != layout.params.end() && it->offset < end; ++it)
    if (it->numel > 0) out.push_back(int64_t(it - layout.params.begin()));
}

}  // namespace

BucketPlan make_bucket_plan(const FlatGroupLayout& layout, BucketShape shape, int64_t bucket_elements) {
  if (bucket_elements < 1) throw Error("bucket plan: bucket size " + std::to_string(bucket_elements) + " < 1 element");
  BucketPlan plan;
  plan.shape = shape;
  plan.param_buckets.resize(layout.params.size());
  if (shape == BucketShape::all_reduce) {
    // Only the parameters' elements are reduced; padding never is.
    for (int64_t end = layout.numel; end > 0;) {
      const int64_t begin = std::max<int64_t>(0, end - bucket_elements);
      Bucket b{begin, end, {}};
      params_in_range(layout, begin, end, b.params);
      plan.buckets.push_back(std::move(b));
      end = begin;
    }
  } else {
    const int64_t slice = std::max<int64_t>(1, bucket_elements / layout.dp_size);
    for (int64_t end = layout.partition_numel; end > 0;) {
      const int64_t begin = std::max<int64_t>(0, end - slice);
      Bucket b{begin, end, {}};
      for (int64_t r = 0; r < layout.dp_size; ++r)
        params_in_range(layout, r * layout.partition_numel + begin, r * layout.partition_numel + end, b.params);
      std::sort(b.params.begin(), b.params.end());
      b.params.erase(std::unique(b.params.begin(), b.params.end()), b.params.end());
      plan.buckets.push_back(std::move(b));
      end = begin;
    }
  }
  for (size_t k = 0; k < plan.buckets.size(); ++k)
    for (int64_t p : plan.buckets[k].params) plan.param_buckets[p].push_back(int64_t(k));
  return plan;
}

}  // namespace tessera::zero
