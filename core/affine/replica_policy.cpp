#include "core/affine/replica_policy.h"

#include "core/affine/errors.h"

namespace tessera::affine {

ReplicaPolicy ReplicaPolicy::lowest() { return ReplicaPolicy{}; }

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

std::string ReplicaPolicy::name() const {
  switch (kind) {
    case Kind::lowest: return "lowest";
    case Kind::local: return "local";
    case Kind::balanced: return "balanced";
    case Kind::callback: return "callback:" + callback_name;
  }
  return "?";
}

ReplicaPolicy parse_replica_policy(const std::string& name) {
  if (name == "lowest") return ReplicaPolicy::lowest();
  if (name == "balanced") return ReplicaPolicy::balanced();
  throw ReplicaPolicyError("unknown replica policy '" + name +
                           "' (expected lowest or balanced; local and callback need tables or code)");
}

}  // namespace tessera::affine
