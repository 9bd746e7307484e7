// The affine layer's errors: every refusal of a map, plan or transfer batch is a tessera::MapError.
//
// Invariant: these are thrown before any byte moves, and the planner's refusals are a pure
// function of its inputs, so every process that plans the same maps raises the same error.
// Every message names the tensor, the rank and the box (Box((origin)+(shape))) involved, e.g.
//   tensor 'layers.0.q_proj.weight': source rank 3 is named as a holder of Box((0,0)+(2048,4096))
//   but does not hold it entirely
//
// Hierarchy (catch the narrowest one you can act on):
//   MapError                      (core/error.h)
//   ├── InvalidMapError           the map contradicts itself or the other map; never fall back
//   │   ├── CoverageError         a target does not cover the tensor / a target piece is under-filled
//   │   ├── HolderError           holders named that do not hold the box; replicas disagree
//   │   └── StorageOverlapError   two pieces of one rank share a storage address; box outside buffer
//   ├── UnsupportedLayoutError    geometry this layer does not express (strides whose elements
//   │                             would share addresses, > 8 axes, DeepSpeed scale != 1, a layout
//   │                             piece that is not a box of its shard in nest())
//   ├── ReplicaPolicyError        a policy that cannot decide (callback returned a non-holder, ...)
//   ├── BudgetExceededError       a safety limit of PlanOptions / executor was exceeded
//   ├── FormatError               a JSON document is malformed or a field has the wrong type
//   └── TransferRefusedError      the local executor refused a batch (aliasing, dtype, bounds)
#pragma once

#include <string>

#include "core/error.h"

namespace tessera::affine {

class InvalidMapError : public MapError {
 public:
  using MapError::MapError;
};
class CoverageError : public InvalidMapError {
 public:
  using InvalidMapError::InvalidMapError;
};
class HolderError : public InvalidMapError {
 public:
  using InvalidMapError::InvalidMapError;
};
class StorageOverlapError : public InvalidMapError {
 public:
  using InvalidMapError::InvalidMapError;
};
class UnsupportedLayoutError : public MapError {
 public:
  using MapError::MapError;
};
class ReplicaPolicyError : public MapError {
 public:
  using MapError::MapError;
};
class BudgetExceededError : public MapError {
 public:
  using MapError::MapError;
};
class FormatError : public MapError {
 public:
  using MapError::MapError;
};
class TransferRefusedError : public MapError {
 public:
  using MapError::MapError;
};

}  // namespace tessera::affine
