// tessera::Error is the root of every exception the public API throws.
//
// Like LibTorch, tessera reports failures by throwing. Each subclass names a family that a
// caller may want to handle differently; the message always carries the context (key path,
// file, rank, tensor, box, operation) needed to act on it without a debugger. Errors are raised
// before any state changes: catching one leaves the object it came from as it was.
//
// Plain C++ only: every layer, core/affine included, may throw these without LibTorch.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A configuration file or value is wrong (key path, value, what was expected, file:line).
class ConfigError : public Error {
 public:
  using Error::Error;
};

// An affine map, plan or transfer batch is invalid (tensor, rank, box).
class MapError : public Error {
 public:
  using Error::Error;
};

// A transport operation failed (UCX, Gloo, NCCL, store), with the operation's name.
class TransportError : public Error {
 public:
  using Error::Error;
};

// A collective, transfer or store wait did not complete within its timeout.
class TimeoutError : public TransportError {
 public:
  using TransportError::TransportError;
};

// A peer process went away (connection lost, killed rank).
class PeerLostError : public TransportError {
 public:
  using TransportError::TransportError;
};

// A checkpoint is missing, corrupt or does not match what is being loaded.
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// An offload file (NVMe swap) cannot be created, read or written, or is not what the engine wrote
// there (size, hash): names the path, the sub-group and the operation.
class OffloadError : public Error {
 public:
  using Error::Error;
};

}  // namespace tessera
