// A BucketPlan cuts a flat gradient buffer into the buckets the gradient reducer reduces, in the
// one order every rank issues them (DESIGN.md §2: collectives in program order, never arrival order).
//
// Buckets are numbered from the END of the flat buffer, because backward produces the last
// layers' gradients first; bucket k is issued once all its parameters reported "ready" and buckets
// 0..k-1 were issued. Two shapes:
//   all-reduce (stages 0/1): bucket k is the flat range [begin, end) of at most bucket_elements.
//   reduce-scatter (stage 2): bucket k is the range [begin, end) relative to each partition; its
//     input is the W slices [r*P + begin, r*P + end) (W * (end - begin) <= bucket_elements, at least
//     one element per slice) and rank r receives the reduced slice r into its own partition.
// A parameter belongs to every bucket it overlaps; padding and empty parameters belong to none.
//
// Example: 66 elements at dp 3 (P = 22), bucket_elements 30, all-reduce: buckets [36, 66), [6, 36),
// [0, 6). Reduce-scatter with bucket_elements 30: slices of 10: [12, 22), [2, 12), [0, 2).
//
// Several flat groups (parameter groups, or gradients reduced in different dtypes) get one plan:
// each group is cut as above and the groups' buckets are merged by the latest parameter (in
// model order) each holds, latest first, ties to the lower group: the order backward tends to
// finish them in, and the same on every rank.
#pragma once

#include <cstdint>
#include <vector>

#include "core/zero/flat_group_layout.h"

namespace tessera::zero {

enum class BucketShape { all_reduce, reduce_scatter };

struct Bucket {
  int64_t begin = 0;  // flat (all_reduce) or partition-relative (reduce_scatter); end exclusive
  int64_t end = 0;
  std::vector<int64_t> params;  // parameter indices overlapping the bucket, ascending (see below)
  int64_t group = 0;            // the flat group whose buffer the range is in
};

struct BucketPlan {
  BucketShape shape = BucketShape::all_reduce;
  std::vector<Bucket> buckets;                      // in issue order
  std::vector<std::vector<int64_t>> param_buckets;  // per parameter: its bucket indices
};

// Where the elements of one parameter go in a bucket's packed input (the staging buffer a
// reduction reads when gradients are not views of one flat buffer): parameter elements
// [param_begin, param_begin + length) to staging elements [staging_begin, ...). The packed input
// is [begin, end) for all-reduce and the W slices [r*P + begin, r*P + end) one after another for
// reduce-scatter. Example: P = 22, bucket [18, 22) (slices of 4), a parameter at flat [20, 42):
// its elements [0, 2) go to staging [2, 4) (rank 0's slice) and [20, 22) to [4, 6) (rank 1's).
struct StagingCopy {
  int64_t param_begin = 0;
  int64_t staging_begin = 0;
  int64_t length = 0;
};
std::vector<StagingCopy> staging_copies(const FlatGroupLayout& layout, BucketShape shape, const Bucket& bucket,
                                        int64_t param_index);

// One group; parameter indices are the layout's. Throws tessera::Error when bucket_elements < 1.
BucketPlan make_bucket_plan(const FlatGroupLayout& layout, BucketShape shape, int64_t bucket_elements);

// Several groups; `model_index[g][i]` is the model-wide index of group g's parameter i (indices
// 0..n-1, each used once, ascending within a group), and the plan's parameter indices are those.
// Throws tessera::Error when the indices are not such a numbering.
BucketPlan make_bucket_plan(const std::vector<FlatGroupLayout>& layouts,
                            const std::vector<std::vector<int64_t>>& model_index, BucketShape shape,
                            int64_t bucket_elements);

}  // namespace tessera::zero
