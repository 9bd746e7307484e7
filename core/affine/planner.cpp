#include "core/affine/planner.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "core/affine/detail/digest.h"
#include "core/affine/detail/map_checks.h"
#include "core/affine/detail/merge_segments.h"
#include "core/affine/errors.h"

namespace tessera::affine {
namespace {

using detail::CheckedMap;
using detail::Frame;

struct Prepared {
  const PlanRequest* request;
  CheckedMap target;
  CheckedMap source;
  detail::BoxIndex regions;
  std::unique_ptr<TensorMap> refined_source;  // set when source replicas were cut to common boxes
};

// One intersection of a target piece with a source region, or part of one (balanced splits).
struct Candidate {
  size_t tensor;
  size_t target_frame;
  size_t region;
  Box box;
  int64_t bytes;
  int chosen = -1;  // index into the region's holder frames
};

void hash_map(detail::Fnv64& h, const TensorMap& map) {
  h.add(map.name);
  h.add(std::string(dtype_name(map.dtype)));
  h.add(map.shape);
  h.add(static_cast<uint64_t>(map.ranks.size()));
  std::vector<const Piece*> pieces;
  for (const auto& [rank, storage] : map.ranks) {
    h.add_signed(rank);
    h.add_signed(storage.buffer_elements);
    h.add(storage.buffer_shape);
    pieces.clear();
    for (const auto& p : storage.pieces) pieces.push_back(&p);
    auto before = [](const Piece* a, const Piece* b) {
      if (a->box != b->box) return a->box < b->box;
      return a->offset < b->offset;
    };
    if (!std::is_sorted(pieces.begin(), pieces.end(), before)) std::sort(pieces.begin(), pieces.end(), before);
    h.add(static_cast<uint64_t>(pieces.size()));
    for (const Piece* p : pieces) {
      h.add(p->box.origin);
      h.add(p->box.shape);
      h.add_signed(p->offset);
      h.add(p->strides);
      h.add(static_cast<uint64_t>(p->holders.size()));
      for (int r : p->holders) h.add_signed(r);
    }
  }
}

void hash_policy(detail::Fnv64& h, const ReplicaPolicy& policy) {
  h.add(policy.name());
  if (policy.kind == ReplicaPolicy::Kind::balanced) h.add_signed(policy.balanced_split_bytes);
  if (policy.kind == ReplicaPolicy::Kind::local) {
    for (const auto* table : {&policy.placement.source_process, &policy.placement.target_process,
                              &policy.placement.process_node}) {
      h.add(static_cast<uint64_t>(table->size()));
      for (const auto& [k, v] : *table) {
        h.add_signed(k);
        h.add_signed(v);
      }
    }
  }
}

Prepared prepare(const PlanRequest& request, const PlanOptions& options) {
  if (request.target_map == nullptr || request.source_map == nullptr) {
    throw InvalidMapError("a plan request needs both a target map and a source map");
  }
  const TensorMap& target = *request.target_map;
  const TensorMap& source = *request.source_map;
  if (target.shape != source.shape) {
    throw InvalidMapError(describe(target) + ": source describes shape " + to_string(source.shape) +
                          " and target describes shape " + to_string(target.shape));
  }
  if (target.dtype != source.dtype) {
    throw InvalidMapError(describe(target) + ": source dtype " + dtype_name(source.dtype) + " differs from target dtype " +
                          dtype_name(target.dtype));
  }
  detail::CheckLimits limits{options.max_pieces, options.max_overlap_runs};
  Prepared p{&request, detail::check_map(target, "target", true, limits), {}, {}, nullptr};
  p.source = detail::check_source_map(source, "source", limits, p.refined_source);
  p.regions = detail::check_source_regions(p.source);
  detail::check_target_coverage(p.target);
  // A target passes every check validate_map() (`tessera affine check`) makes, holders agreeing
  // element by element included: overlapping pieces that each claim to be the only holder are
  // refused here as there (DeepSpeed's planner refuses them too).
  {
    std::unique_ptr<TensorMap> refined_target;
    detail::check_source_regions(detail::check_source_map(target, "target", limits, refined_target));
  }
  return p;
}

// Splits a candidate along its outermost axis of extent > 1 into `parts` nearly equal parts.
std::vector<Box> split_box(const Box& box, int64_t parts) {
  int axis = -1;
  for (int k = 0; k < box.ndim(); ++k) {
    if (box.shape[k] > 1) {
      axis = k;
      break;
    }
  }
  if (axis < 0 || parts <= 1) return {box};
  parts = std::min(parts, box.shape[axis]);
  std::vector<Box> out;
  const int64_t base = box.shape[axis] / parts, extra = box.shape[axis] % parts;
  int64_t at = box.origin[axis];
  for (int64_t i = 0; i < parts; ++i) {
    Box b = box;
    b.origin[axis] = at;
    b.shape[axis] = base + (i < extra ? 1 : 0);
    at += b.shape[axis];
    out.push_back(b);
  }
  return out;
}

class Assigner {
 public:
  Assigner(const std::vector<Prepared>& prepared, const PlanOptions& options)
      : prepared_(prepared), policy_(options.policy) {}

  void run(std::vector<Candidate>& candidates) {
    // Single holders are forced; they load their rank first.
    std::vector<size_t> free;
    for (size_t i = 0; i < candidates.size(); ++i) {
      auto [first, count] = holders(candidates[i]);
      if (count == 1 || policy_.kind == ReplicaPolicy::Kind::lowest) {
        choose(candidates[i], 0);
      } else {
        free.push_back(i);
      }
    }
    if (policy_.kind == ReplicaPolicy::Kind::callback) {
      for (size_t i : free) choose(candidates[i], call_back(candidates[i]));
      return;
    }
    if (policy_.kind == ReplicaPolicy::Kind::balanced) {
      std::vector<Candidate> split;
      for (size_t i : free) {
        const int64_t count = static_cast<int64_t>(holders(candidates[i]).second);
        if (candidates[i].bytes >= policy_.balanced_split_bytes && count > 1) {
          const int64_t esize = candidates[i].bytes / candidates[i].box.volume();
          auto parts = split_box(candidates[i].box, count);
          candidates[i].box = parts[0];
          candidates[i].bytes = parts[0].volume() * esize;
          for (size_t k = 1; k < parts.size(); ++k) {
            Candidate c = candidates[i];
            c.box = parts[k];
            c.bytes = parts[k].volume() * esize;
            split.push_back(c);
          }
        }
      }
      for (auto& c : split) {
        free.push_back(candidates.size());
        candidates.push_back(c);
      }
    }
    std::stable_sort(free.begin(), free.end(),
                     [&](size_t a, size_t b) { return candidates[a].bytes > candidates[b].bytes; });
    for (size_t i : free) choose(candidates[i], least_loaded(candidates[i]));
  }

 private:
  std::pair<const Frame*, size_t> holders(const Candidate& c) const {
    const CheckedMap& src = prepared_[c.tensor].source;
    const size_t b = src.group_begin[c.region], e = src.group_begin[c.region + 1];
    return {&src.frames[b], e - b};
  }

  void choose(Candidate& c, int index) {
    c.chosen = index;
    load_[holders(c).first[index].rank] += c.bytes;
  }

  int locality(const Candidate& c, int source_rank) const {
    const Placement& pl = policy_.placement;
    const int target_rank = prepared_[c.tensor].target.frames[c.target_frame].rank;
    auto s = pl.source_process.find(source_rank);
    auto t = pl.target_process.find(target_rank);
    if (s == pl.source_process.end() || t == pl.target_process.end()) {
      throw ReplicaPolicyError(describe(*prepared_[c.tensor].target.map) + ": the local replica policy has no process for " +
                               (s == pl.source_process.end() ? "source rank " + std::to_string(source_rank)
                                                             : "target rank " + std::to_string(target_rank)));
    }
    if (s->second == t->second) return 0;
    auto node = [&](int process) {
      auto it = pl.process_node.find(process);
      return it == pl.process_node.end() ? -1 - process : it->second;
    };
    return node(s->second) == node(t->second) ? 1 : 2;
  }

  int least_loaded(const Candidate& c) {
    auto [first, count] = holders(c);
    int best = 0;
    auto key = [&](size_t i) {
      const int rank = first[i].rank;
      const int cls = policy_.kind == ReplicaPolicy::Kind::local ? locality(c, rank) : 0;
      return std::make_tuple(cls, load_[rank], rank);
    };
    auto best_key = key(0);
    for (size_t i = 1; i < count; ++i) {
      auto k = key(i);
      if (k < best_key) {
        best_key = k;
        best = static_cast<int>(i);
      }
    }
    return best;
  }

  int call_back(const Candidate& c) {
    const Prepared& p = prepared_[c.tensor];
    const Frame& target = p.target.frames[c.target_frame];
    auto [first, count] = holders(c);
    ReplicaRequest request;
    request.tensor = p.target.map->name;
    request.target_rank = target.rank;
    request.box = c.box;
    request.target_offset = target.piece->address_of(c.box.origin);
    request.target_strides = target.piece->strides;
    for (size_t i = 0; i < count; ++i) {
      request.candidates.push_back(
          ReplicaCandidate{first[i].rank, first[i].piece->address_of(c.box.origin), first[i].piece->strides});
    }
    if (!policy_.choose) throw ReplicaPolicyError("the callback replica policy '" + policy_.callback_name + "' has no function");
    const int rank = policy_.choose(request);
    for (size_t i = 0; i < count; ++i) {
      if (first[i].rank == rank) return static_cast<int>(i);
    }
    throw ReplicaPolicyError(describe(*p.target.map) + ": replica policy '" + policy_.callback_name +
                             "' returned source rank " + std::to_string(rank) + " for target rank " +
                             std::to_string(target.rank) + " " + to_string(c.box) + ", which is not one of its holders " +
                             detail::holders_label(first->piece->holders));
  }

  const std::vector<Prepared>& prepared_;
  const ReplicaPolicy& policy_;
  std::map<int, int64_t> load_;
};

}  // namespace

uint64_t input_digest(const TensorMap& target_map, const TensorMap& source_map, const ReplicaPolicy& policy) {
  detail::Fnv64 h;
  h.add(std::string("tessera.plan-input.v1"));
  hash_map(h, target_map);
  hash_map(h, source_map);  // the map as given (not its cut copy): processes compare inputs
  hash_policy(h, policy);
  return h.value();
}

Plan plan(const TensorMap& target_map, const TensorMap& source_map, const PlanOptions& options) {
  return std::move(plan_batch({PlanRequest{&target_map, &source_map}}, options).front());
}

std::vector<Plan> plan_batch(const std::vector<PlanRequest>& requests, const PlanOptions& options) {
  std::vector<Prepared> prepared;
  prepared.reserve(requests.size());
  for (const auto& request : requests) prepared.push_back(prepare(request, options));

  // Intersections, in canonical order: tensors in request order, target frames by (box, rank).
  std::vector<Candidate> candidates;
  for (size_t t = 0; t < prepared.size(); ++t) {
    const Prepared& p = prepared[t];
    const int64_t esize = element_size(p.target.map->dtype);
    for (size_t f = 0; f < p.target.frames.size(); ++f) {
      const Frame& frame = p.target.frames[f];
      int64_t filled = 0;
      p.regions.for_each_overlap(frame.piece->box, [&](size_t g, const Box& overlap) {
        candidates.push_back(Candidate{t, f, g, overlap, overlap.volume() * esize});
        filled += overlap.volume();
      });
      if (filled != frame.piece->box.volume()) {
        throw CoverageError(describe(*p.target.map) + ": target rank " + std::to_string(frame.rank) + " region " +
                            to_string(frame.piece->box) + " would receive " + std::to_string(filled) + " of its " +
                            std::to_string(frame.piece->box.volume()) + " elements");
      }
      if (static_cast<int64_t>(candidates.size()) > options.max_candidates) {
        throw BudgetExceededError(describe(*p.target.map) + ": more than max_candidates = " +
                                  std::to_string(options.max_candidates) + " intersections");
      }
    }
  }
  Assigner(prepared, options).run(candidates);

  std::vector<Plan> plans(prepared.size());
  std::vector<std::vector<Segment>> segments(prepared.size());
  for (const Candidate& c : candidates) {
    const Prepared& p = prepared[c.tensor];
    const Frame& target = p.target.frames[c.target_frame];
    const Frame& source = p.source.frames[p.source.group_begin[c.region] + static_cast<size_t>(c.chosen)];
    Segment s;
    s.source_rank = source.rank;
    s.source_offset = source.piece->address_of(c.box.origin);
    s.source_strides = source.piece->strides;
    s.target_rank = target.rank;
    s.target_offset = target.piece->address_of(c.box.origin);
    s.target_strides = target.piece->strides;
    s.shape = c.box.shape;
    detail::collapse(s);
    segments[c.tensor].push_back(s);
    ++plans[c.tensor].statistics.candidate_segments;
  }
  for (size_t t = 0; t < prepared.size(); ++t) {
    const Prepared& p = prepared[t];
    Plan& out = plans[t];
    out.name = p.target.map->name;
    out.dtype = p.target.map->dtype;
    out.shape = p.target.map->shape;
    out.policy = options.policy.name();
    out.input_digest = input_digest(*p.target.map, *p.source.map, options.policy);
    detail::merge_segments(segments[t]);
    detail::sort_segments(segments[t]);
    if (static_cast<int64_t>(segments[t].size()) > options.max_segments) {
      throw BudgetExceededError(describe(*p.target.map) + ": " + std::to_string(segments[t].size()) +
                                " segments, over max_segments = " + std::to_string(options.max_segments));
    }
    out.segments = std::move(segments[t]);
    out.statistics.source_pieces = static_cast<int64_t>(p.source.frames.size());
    out.statistics.source_regions = static_cast<int64_t>(p.source.groups());
    out.statistics.target_pieces = static_cast<int64_t>(p.target.frames.size());
    recompute_segment_statistics(out);
  }
  return plans;
}

}  // namespace tessera::affine
