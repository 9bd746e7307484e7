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

BucketPlan make_bucket_plan(const FlatGroupLayout& layout, BucketShape shape, int64_t bucket_elements, BucketCut cut) {
  if (bucket_elements < 1) throw Error("bucket plan: bucket size " + std::to_string(bucket_elements) + " < 1 element");
  BucketPlan plan;
  plan.shape = shape;
  plan.param_buckets.resize(layout.params.size());
  // Only the parameters' elements are reduced; padding never is. Reduce-to-owner buckets also
  // stop at partition boundaries.
  const int64_t partition = std::max<int64_t>(1, layout.partition_numel);
  for (int64_t end = layout.numel; end > 0;) {
    const int64_t owner = (end - 1) / partition;
    int64_t begin = std::max<int64_t>(0, end - bucket_elements);
    if (shape == BucketShape::reduce_to_owner) begin = std::max(begin, owner * partition);
    if (cut == BucketCut::per_parameter) {  // the start of the parameter holding element end - 1
      const auto holder = std::upper_bound(layout.params.begin(), layout.params.end(), end - 1,
                                           [](int64_t e, const ParameterSlot& p) { return e < p.offset + p.numel; });
      begin = std::max(begin, holder->offset);
    }
    Bucket b{begin, end, {}, 0, shape == BucketShape::reduce_to_owner ? int(owner) : -1};
    params_in_range(layout, begin, end, b.params);
    plan.buckets.push_back(std::move(b));
    end = begin;
  }
  for (size_t k = 0; k < plan.buckets.size(); ++k)
    for (int64_t p : plan.buckets[k].params) plan.param_buckets[p].push_back(int64_t(k));
  return plan;
}

StagingCopy staging_copy(const FlatGroupLayout& layout, const Bucket& bucket, int64_t param_index) {
  const auto& slot = layout.params.at(size_t(param_index));
  const int64_t lo = std::max(slot.offset, bucket.begin);
  const int64_t hi = std::min(slot.offset + slot.numel, bucket.end);
  if (lo >= hi) return {};
  return {lo - slot.offset, lo - bucket.begin, hi - lo};
}

BucketPlan make_bucket_plan(const std::vector<FlatGroupLayout>& layouts,
                            const std::vector<std::vector<int64_t>>& model_index, BucketShape shape,
                            int64_t bucket_elements, BucketCut cut) {
  if (layouts.size() != model_index.size())
    throw Error("bucket plan: " + std::to_string(layouts.size()) + " groups but " + std::to_string(model_index.size()) +
                " index lists");
  int64_t total = 0;
  for (const auto& ids : model_index) total += int64_t(ids.size());
  std::vector<char> used(total, 0);
  for (size_t g = 0; g < layouts.size(); ++g) {
    if (model_index[g].size() != layouts[g].params.size())
      throw Error("bucket plan: group " + std::to_string(g) + " has " + std::to_string(layouts[g].params.size()) +
                  " parameters but " + std::to_string(model_index[g].size()) + " indices");
    for (size_t i = 0; i < model_index[g].size(); ++i) {
      const int64_t id = model_index[g][i];
      if (id < 0 || id >= total || used[id] || (i > 0 && id <= model_index[g][i - 1]))
        throw Error("bucket plan: group " + std::to_string(g) + " parameter " + std::to_string(i) + " has index " +
                    std::to_string(id) + "; expected ascending indices used once in [0, " + std::to_string(total) + ")");
      used[id] = 1;
    }
  }
  // Each group's buckets with model-wide indices; the key is the latest parameter it holds.
  std::vector<std::vector<Bucket>> per_group;
  for (size_t g = 0; g < layouts.size(); ++g) {
    auto plan = make_bucket_plan(layouts[g], shape, bucket_elements, cut);
    for (auto& b : plan.buckets) {
      b.group = int64_t(g);
      for (auto& p : b.params) p = model_index[g][p];
    }
    per_group.push_back(std::move(plan.buckets));
  }
  auto key = [](const Bucket& b) { return b.params.empty() ? int64_t(-1) : b.params.back(); };
  BucketPlan plan;
  plan.shape = shape;
  plan.param_buckets.resize(total);
  std::vector<size_t> next(per_group.size(), 0);
  for (;;) {  // k-way merge of the groups' own orders
    int64_t best = -1;
    for (size_t g = 0; g < per_group.size(); ++g)
      if (next[g] < per_group[g].size() && (best < 0 || key(per_group[g][next[g]]) > key(per_group[best][next[best]])))
        best = int64_t(g);
    if (best < 0) break;
    plan.buckets.push_back(std::move(per_group[best][next[best]++]));
  }
  for (size_t k = 0; k < plan.buckets.size(); ++k)
    for (int64_t p : plan.buckets[k].params) plan.param_buckets[p].push_back(int64_t(k));
  return plan;
}

}  // namespace tessera::zero
