#include "core/affine/replica_policy.h"

#include "core/affine/errors.h"

namespace tessera::affine {

const char* name_of(ReplicaPolicyKind kind) {
  for (const auto& [k, name] : kReplicaPolicyNames) {
    if (k == kind) return name;
  }
  return kind == ReplicaPolicyKind::callback ? "callback" : "?";
}

ReplicaPolicyKind replica_policy_kind(const std::string& name) {
  std::string choices;
  for (const auto& [k, spelling] : kReplicaPolicyNames) {
    if (name == spelling) return k;
    choices += std::string(choices.empty() ? "" : ", ") + spelling;
  }
  throw ReplicaPolicyError("unknown replica policy '" + name + "' (expected one of " + choices + ")");
}

ReplicaPolicy ReplicaPolicy::lowest() {
  ReplicaPolicy p;
  p.kind = Kind::lowest;
  return p;
}

ReplicaPolicy ReplicaPolicy::balanced() {
  ReplicaPolicy p;
  p.kind = Kind::balanced;
  return p;
}

ReplicaPolicy ReplicaPolicy::local(Placement placement) {
  ReplicaPolicy p;
  p.kind = Kind::local;
  p.placement = std::move(placement);
  return p;
}

ReplicaPolicy ReplicaPolicy::callback(std::string name, std::function<int(const ReplicaRequest&)> choose) {
  ReplicaPolicy p;
  p.kind = Kind::callback;
  p.callback_name = std::move(name);
  p.choose = std::move(choose);
  return p;
}

ReplicaPolicy ReplicaPolicy::of(Kind kind, Placement placement) {
  switch (kind) {
    case Kind::lowest: return lowest();
    case Kind::balanced: return balanced();
    case Kind::local: return local(std::move(placement));
    case Kind::callback: break;
  }
  throw ReplicaPolicyError(std::string("a replica policy of kind '") + name_of(kind) +
                           "' cannot be made from its kind (a callback policy needs its function: ReplicaPolicy::callback)");
}

std::string ReplicaPolicy::name() const {
  if (kind == Kind::callback) return "callback:" + callback_name;
  return name_of(kind);
}

ReplicaPolicy parse_replica_policy(const std::string& name) {
  const auto kind = replica_policy_kind(name);
  if (kind == ReplicaPolicyKind::local)
    throw ReplicaPolicyError("replica policy 'local' needs placement tables (ReplicaPolicy::local); expected lowest or balanced");
  return ReplicaPolicy::of(kind);
}

}  // namespace tessera::affine
