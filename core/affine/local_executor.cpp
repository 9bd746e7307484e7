#include "core/affine/local_executor.h"

#include <algorithm>
#include <string>
#include <utility>

#include "core/affine/chunking.h"
#include "core/affine/detail/strided_copy.h"
#include "core/affine/detail/strided_region.h"
#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

std::string seg_label(const Plan& plan, size_t index, const Segment& s) {
  return "tensor '" + plan.name + "' segment " + std::to_string(index) + " (source rank " +
         std::to_string(s.source_rank) + " -> target rank " + std::to_string(s.target_rank) + ", shape " +
         to_string(s.shape) + ")";
}

const LocalBuffer* buffer_of(const std::map<int, LocalBuffer>& buffers, int rank, const Plan& plan, const char* side,
                             bool only_held) {
  auto it = buffers.find(rank);
  if (it == buffers.end()) {
    if (only_held) return nullptr;
    throw TransferRefusedError("tensor '" + plan.name + "': the plan reads/writes " + side + " rank " +
                               std::to_string(rank) + " but the batch gives no buffer for it; no data moved");
  }
  return &it->second;
}

void check_side(const Plan& plan, size_t index, const Segment& s, const LocalBuffer& buf, int64_t offset,
                const Dims& strides, const char* side, int rank) {
  if (buf.dtype != plan.dtype) {
    throw TransferRefusedError("tensor '" + plan.name + "': " + side + " rank " + std::to_string(rank) +
                               " buffer has dtype " + dtype_name(buf.dtype) + " but the plan moves " +
                               dtype_name(plan.dtype) + "; no data moved");
  }
  if (buf.elements > 0 && buf.data == nullptr) {
    throw TransferRefusedError("tensor '" + plan.name + "': " + side + " rank " + std::to_string(rank) +
                               " buffer is null; no data moved");
  }
  int64_t last = offset;
  for (int k = 0; k < s.shape.size(); ++k) {
    if (s.shape[k] <= 0 || strides[k] < 0) {
      throw TransferRefusedError(seg_label(plan, index, s) + " has a non-positive extent or a negative stride; no data moved");
    }
    last += (s.shape[k] - 1) * strides[k];
  }
  if (s.shape.size() == 0) {
    throw TransferRefusedError(seg_label(plan, index, s) + " is zero-dimensional; no data moved");
  }
  if (offset < 0 || last >= buf.elements) {
    throw TransferRefusedError(seg_label(plan, index, s) + " reaches element " + std::to_string(last) + " of a " +
                               std::to_string(buf.elements) + "-element " + side + " buffer of rank " +
                               std::to_string(rank) + "; no data moved");
  }
}

struct ByteRange {
  uintptr_t begin, end;
  std::string label;
};

}  // namespace

void validate_local_batch(const std::vector<LocalTransfer>& batch, const LocalExecutorOptions& options) {
  std::vector<detail::StridedRegion> targets;
  std::vector<std::string> target_labels;
  std::vector<ByteRange> source_ranges, target_ranges;
  for (size_t t = 0; t < batch.size(); ++t) {
    const LocalTransfer& tr = batch[t];
    if (tr.plan == nullptr) throw TransferRefusedError("transfer " + std::to_string(t) + " of the batch has no plan");
    const Plan& plan = *tr.plan;
    const int64_t esize = element_size(plan.dtype);
    if (options.staging_bytes < esize) {
      throw BudgetExceededError("a staging budget of " + std::to_string(options.staging_bytes) +
                                " bytes cannot hold one element of tensor '" + plan.name + "'");
    }
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const Segment& s = plan.segments[i];
      if (s.source_strides.size() != s.shape.size() || s.target_strides.size() != s.shape.size()) {
        throw TransferRefusedError(seg_label(plan, i, s) + " has stride vectors of the wrong length; no data moved");
      }
      const bool only = options.only_held_buffers;
      const LocalBuffer* src = buffer_of(tr.source_buffers, s.source_rank, plan, "source", only);
      const LocalBuffer* dst = buffer_of(tr.target_buffers, s.target_rank, plan, "target", only);
      if (src) check_side(plan, i, s, *src, s.source_offset, s.source_strides, "source", s.source_rank);
      if (!dst) continue;
      check_side(plan, i, s, *dst, s.target_offset, s.target_strides, "target", s.target_rank);
      detail::StridedRegion region;
      region.base = static_cast<int64_t>(reinterpret_cast<uintptr_t>(dst->data)) + s.target_offset * esize;
      region.extents = s.shape;
      region.strides = s.target_strides;
      for (int k = 0; k < region.strides.size(); ++k) region.strides[k] *= esize;
      region.width = esize;
      targets.push_back(region);
      target_labels.push_back(seg_label(plan, i, s));
    }
    for (const auto& [rank, b] : tr.source_buffers) {
      const auto begin = reinterpret_cast<uintptr_t>(b.data);
      source_ranges.push_back(ByteRange{begin, begin + static_cast<uintptr_t>(b.elements * element_size(b.dtype)),
                                        "tensor '" + plan.name + "' source rank " + std::to_string(rank)});
    }
    for (const auto& [rank, b] : tr.target_buffers) {
      const auto begin = reinterpret_cast<uintptr_t>(b.data);
      target_ranges.push_back(ByteRange{begin, begin + static_cast<uintptr_t>(b.elements * element_size(b.dtype)),
                                        "tensor '" + plan.name + "' target rank " + std::to_string(rank)});
    }
  }
  // A source buffer must not share bytes with any target buffer.
  std::sort(target_ranges.begin(), target_ranges.end(), [](const ByteRange& a, const ByteRange& b) { return a.begin < b.begin; });
  std::vector<uintptr_t> running_end(target_ranges.size());
  for (size_t i = 0; i < target_ranges.size(); ++i) {
    running_end[i] = std::max(target_ranges[i].end, i ? running_end[i - 1] : 0);
  }
  for (const auto& src : source_ranges) {
    if (src.begin == src.end) continue;
    size_t hi = static_cast<size_t>(std::lower_bound(target_ranges.begin(), target_ranges.end(), src.end,
                                                     [](const ByteRange& r, uintptr_t v) { return r.begin < v; }) -
                                    target_ranges.begin());
    while (hi > 0) {
      --hi;
      if (running_end[hi] <= src.begin) break;
      const auto& dst = target_ranges[hi];
      if (dst.begin < src.end && src.begin < dst.end && dst.begin != dst.end) {
        throw TransferRefusedError(src.label + " buffer shares memory with " + dst.label +
                                   " buffer; a source may not alias a target; no data moved");
      }
    }
  }
  if (auto clash = detail::find_overlap(targets, options.max_overlap_runs)) {
    throw TransferRefusedError(target_labels[clash->first] + " and " + target_labels[clash->second] +
                               " write the same target bytes: a target byte written twice (overlapping targets or aliasing buffers); no data moved");
  }
}

TransferStats execute_local(const std::vector<LocalTransfer>& batch, const LocalExecutorOptions& options) {
  if (options.only_held_buffers) {
    throw TransferRefusedError("execute_local needs every buffer of the batch; only_held_buffers is for validation");
  }
  validate_local_batch(batch, options);
  std::vector<const Plan*> plans;
  for (const auto& tr : batch) plans.push_back(tr.plan);
  const auto rounds = schedule_rounds(plans, options.staging_bytes);
  TransferStats stats;
  for (const auto* p : plans) stats.segments += static_cast<int64_t>(p->segments.size());
  stats.rounds = static_cast<int64_t>(rounds.size());
  std::vector<uint8_t> staging;
  if (options.through_staging) {
    int64_t largest = 0;
    for (const auto& round : rounds) {
      int64_t bytes = 0;
      for (const auto& c : round) bytes += c.bytes;
      largest = std::max(largest, bytes);
    }
    staging.resize(static_cast<size_t>(largest));
  }
  for (const auto& round : rounds) {
    // Pack (staged) or copy (direct) every chunk of the round, then unpack when staged.
    int64_t at = 0;
    for (int pass = 0; pass < (options.through_staging ? 2 : 1); ++pass) {
      at = 0;
      for (const Chunk& c : round) {
        const LocalTransfer& tr = batch[c.plan];
        const Segment& s = tr.plan->segments[c.segment];
        const int64_t esize = element_size(tr.plan->dtype);
        int64_t src_off = s.source_offset, dst_off = s.target_offset;
        Dims src_strides = s.source_strides, dst_strides = s.target_strides;
        for (int k = 0; k < s.shape.size(); ++k) {
          src_off += c.origin[k] * s.source_strides[k];
          dst_off += c.origin[k] * s.target_strides[k];
          src_strides[k] *= esize;
          dst_strides[k] *= esize;
        }
        auto* src = static_cast<const uint8_t*>(tr.source_buffers.at(s.source_rank).data) + src_off * esize;
        auto* dst = static_cast<uint8_t*>(tr.target_buffers.at(s.target_rank).data) + dst_off * esize;
        if (!options.through_staging) {
          stats.copy_runs += detail::strided_copy(dst, dst_strides, src, src_strides, c.shape, esize);
        } else {
          // Packed layout: the chunk row-major at staging + at.
          Dims packed(c.shape.size());
          int64_t stride = esize;
          for (int k = c.shape.size() - 1; k >= 0; --k) {
            packed[k] = stride;
            stride *= c.shape[k];
          }
          uint8_t* stage = staging.data() + at;
          if (pass == 0) {
            stats.copy_runs += detail::strided_copy(stage, packed, src, src_strides, c.shape, esize);
          } else {
            stats.copy_runs += detail::strided_copy(dst, dst_strides, stage, packed, c.shape, esize);
          }
        }
        at += c.bytes;
        if (pass == 0) {
          ++stats.chunks;
          stats.bytes_copied += c.bytes;
        }
      }
    }
  }
  return stats;
}

}  // namespace tessera::affine
