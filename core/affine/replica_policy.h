// A ReplicaPolicy decides which holder a replicated source region is read from. It runs inside the
// planner, which sees every intersection of a batch, and is deterministic: the choice depends only on
// the maps, the policy and its placement tables, never on piece order or on which process plans.
//
// Kinds:
//   lowest    the lowest holder rank (all reads of a ZeRO-2 replica set hit DP rank 0).
//   local     a holder on the target's process, else on its node, else any; within the best class the
//             holder with the fewest bytes assigned so far (ties: lowest rank). Needs `placement`.
//   balanced  minimise the most-loaded source rank: intersections are assigned largest first to the
//             least-loaded holder (ties: lowest rank); an intersection of at least
//             `balanced_split_bytes` is first cut along its outermost non-trivial axis into one part
//             per holder, so a single big replicated region is read from all holders.
//   callback  a user function, called once per intersection with >= 2 holders, in canonical order;
//             it must return one of the candidates' ranks (else ReplicaPolicyError).
//
// Example: a (4096, 4096) TP shard replicated on DP ranks {0,2,4,6} (ZeRO-2) read by one rollout rank:
// lowest reads all 32 MiB (bf16) from rank 0; balanced reads 8 MiB from each of the four.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/affine/box.h"

namespace tessera::affine {

// The policy's kind: the one type that names a replica policy everywhere (the planner, the weight
// sync's WeightSyncOptions::replica_policy, the configuration's [tessera.rollout] replica_policy).
enum class ReplicaPolicyKind { lowest, local, balanced, callback };

// The default everywhere a replica policy is not chosen (a default ReplicaPolicy, PlanOptions, the
// weight sync, [tessera.rollout]): lowest. On 2 shared cores bench/sync's 327 MB sync took
// 46-56 ms lowest against 51-64 ms balanced (streaming copies, the source hashed during the
// transfer); balanced pays off where the training ranks have their own cores and links.
inline constexpr ReplicaPolicyKind kDefaultReplicaPolicy = ReplicaPolicyKind::lowest;

// The kinds a name selects, as every file and command line spells them (callback needs code, so
// it has no name here). The configuration decoder reads its table of names from this one.
inline constexpr std::pair<ReplicaPolicyKind, const char*> kReplicaPolicyNames[] = {
    {ReplicaPolicyKind::lowest, "lowest"}, {ReplicaPolicyKind::local, "local"}, {ReplicaPolicyKind::balanced, "balanced"}};

// "lowest", "local", "balanced", "callback".
const char* name_of(ReplicaPolicyKind kind);
// The kind named `name` (exact spelling, one of kReplicaPolicyNames); throws ReplicaPolicyError
// naming the choices otherwise.
ReplicaPolicyKind replica_policy_kind(const std::string& name);

struct ReplicaCandidate {
  int source_rank = 0;
  int64_t source_offset = 0;  // address of the request's box origin in that holder's buffer
  Dims source_strides;
};

struct ReplicaRequest {
  std::string tensor;
  int target_rank = 0;
  Box box;  // logical region to be read
  int64_t target_offset = 0;
  Dims target_strides;
  std::vector<ReplicaCandidate> candidates;  // sorted by rank
};

// Where ranks run: source and target rank spaces are separate; processes are global ids.
struct Placement {
  std::map<int, int> source_process;  // source rank -> process
  std::map<int, int> target_process;  // target rank -> process
  std::map<int, int> process_node;    // process -> node (missing: every process on its own node)
};

struct ReplicaPolicy {
  using Kind = ReplicaPolicyKind;
  Kind kind = kDefaultReplicaPolicy;
  Placement placement;                                // kind == local
  std::function<int(const ReplicaRequest&)> choose;  // kind == callback
  std::string callback_name = "callback";             // enters the input digest
  int64_t balanced_split_bytes = int64_t{1} << 20;    // kind == balanced

  static ReplicaPolicy lowest();
  static ReplicaPolicy balanced();
  static ReplicaPolicy local(Placement placement);
  static ReplicaPolicy callback(std::string name, std::function<int(const ReplicaRequest&)> choose);
  // The policy of a named kind: lowest and balanced need nothing, local needs `placement`;
  // callback needs code (throws ReplicaPolicyError; use callback()).
  static ReplicaPolicy of(Kind kind, Placement placement = {});
  std::string name() const;  // "lowest", "local", "balanced", "callback:<name>"
};

// "lowest" or "balanced" (the policies that need no tables); throws ReplicaPolicyError otherwise.
ReplicaPolicy parse_replica_policy(const std::string& name);

}  // namespace tessera::affine
