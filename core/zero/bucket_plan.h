// A BucketPlan cuts a flat gradient buffer into the buckets the gradient reducer reduces, in the
// one order every rank issues them (docs/DESIGN.md §7.3: collectives in program order, never arrival order).
//
// Buckets are contiguous flat ranges [begin, end) (end exclusive) of at most bucket_elements,
// numbered from the END of the buffer, because backward produces the last layers' gradients
// first; bucket k is issued once all its parameters reported "ready" and buckets 0..k-1 were
// issued. Padding is never part of a bucket. Two shapes:
//   all_reduce (stages 0/1): every rank receives the averaged bucket (owner = -1).
//   reduce_to_owner (stage 2, partitioned gradients): buckets never cross a partition boundary,
//     so each lies in one rank's partition; that rank (owner) receives the averaged bucket and
//     adds it into its gradient partition, the others only contribute (DeepSpeed's stage 2
//     reduces each bucket slice to the rank that owns it). A bucket fills in backward order
//     from gradients that are ready together, so its staging can be bounded (bucket_staging.h).
// A parameter belongs to every bucket it overlaps; empty parameters belong to none.
// Cut per_parameter: a bucket also never crosses a parameter boundary, so each holds (a piece of)
// one parameter. That is DeepSpeed's reduce_bucket_size 0, where every gradient exceeds the
// bucket and is reduced on its own as soon as it is ready.
//
// Example: 66 elements at dp 3 (P = 22), bucket_elements 30, all-reduce: buckets [36, 66), [6, 36),
// [0, 6). Reduce-to-owner: [44, 66) owner 2, [22, 44) owner 1, [0, 22) owner 0; with
// bucket_elements 10: [56, 66), [46, 56), [44, 46) (owner 2), [34, 44), [24, 34), [22, 24) (owner 1), ...
// Per parameter, numels {35, 13, 24, 1} at dp 3 (73 elements, P = 25), no size limit: all-reduce
// [72, 73), [48, 72), [35, 48), [0, 35); reduce-to-owner [72, 73), [50, 72) (owner 2), [48, 50),
// [35, 48), [25, 35) (owner 1), [0, 25) (owner 0).
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

enum class BucketShape { all_reduce, reduce_to_owner };
enum class BucketCut {
  by_size,        // buckets of bucket_elements, across parameters
  per_parameter,  // also cut at every parameter boundary (bucket_elements bounds the pieces)
};

struct Bucket {
  int64_t begin = 0;  // flat range of the group's buffer; end exclusive
  int64_t end = 0;
  std::vector<int64_t> params;  // parameter indices overlapping the bucket, ascending (see below)
  int64_t group = 0;            // the flat group whose buffer the range is in
  int owner = -1;               // reduce_to_owner: the rank whose partition holds the range

  int64_t elements() const { return end - begin; }
};

struct BucketPlan {
  BucketShape shape = BucketShape::all_reduce;
  std::vector<Bucket> buckets;                      // in issue order
  std::vector<std::vector<int64_t>> param_buckets;  // per parameter: its bucket indices
};

// Where the elements of one parameter go in a bucket's packed input (its staging buffer, when
// gradients are not views of one flat buffer): parameter elements [param_begin, param_begin +
// length) to staging elements [staging_begin, ...); length 0 when the parameter misses the bucket.
// Example: bucket [18, 22), a parameter at flat [20, 42): its elements [0, 2) go to staging [2, 4).
struct StagingCopy {
  int64_t param_begin = 0;
  int64_t staging_begin = 0;
  int64_t length = 0;
};
StagingCopy staging_copy(const FlatGroupLayout& layout, const Bucket& bucket, int64_t param_index);

// One group; parameter indices are the layout's. Throws tessera::Error when bucket_elements < 1.
BucketPlan make_bucket_plan(const FlatGroupLayout& layout, BucketShape shape, int64_t bucket_elements,
                            BucketCut cut = BucketCut::by_size);

// Several groups; `model_index[g][i]` is the model-wide index of group g's parameter i (indices
// 0..n-1, each used once, ascending within a group), and the plan's parameter indices are those.
// Throws tessera::Error when the indices are not such a numbering.
BucketPlan make_bucket_plan(const std::vector<FlatGroupLayout>& layouts,
                            const std::vector<std::vector<int64_t>>& model_index, BucketShape shape,
                            int64_t bucket_elements, BucketCut cut = BucketCut::by_size);

}  // namespace tessera::zero
