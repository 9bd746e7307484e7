// BucketStaging holds the packed inputs of one backward's reduce-scatter buckets when gradients
// are partitioned (ZeRO-2 across ranks): as each parameter's gradient becomes final it is copied
// into the buckets it overlaps (zero::staging_copies) and the parameter's .grad is released, so
// no full-size gradient buffer ever exists.
//
// Threads: take() runs where autograd reports the gradient (its thread, before the reducer is
// told the parameter is ready), so the next backward can never meet this one's .grad; the
// reducer then takes a bucket's buffer with release() once every parameter in it was reported.
// Different buckets are different buffers, so the two threads never touch the same one at once.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace tessera::actors {

namespace detail {
struct EngineShared;
}

class BucketStaging {
 public:
  explicit BucketStaging(std::shared_ptr<const detail::EngineShared> shared);

  // Copies parameter `param`'s .grad (absent: zeros) into its buckets and releases it; once.
  void take(int64_t param);
  // take() for every parameter not taken yet (unused in this backward, or accumulated in
  // no_sync / coalesce blocks).
  void take_rest();
  // Bucket k's packed input (zeros where nothing was taken); the staging forgets it.
  at::Tensor release(size_t bucket);

 private:
  at::Tensor& buffer(size_t bucket);
  std::shared_ptr<const detail::EngineShared> shared_;
  std::vector<at::Tensor> staging_;                  // per bucket
  std::vector<char> taken_;                          // per parameter
  std::vector<std::pair<int64_t, int64_t>> place_;   // per parameter: (flat group, index in it)
};

}  // namespace tessera::actors
