// A Backend runs collectives synchronously for a Communicator, on the communicator's sequencer
// thread only (never concurrently with itself). Inputs are validated by the Communicator before
// they get here: flat, contiguous, matching sizes. Errors are thrown as they come (c10::Error,
// gloo exceptions, ...); the Communicator converts them, adding its context.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/communicator.h"

namespace tessera::transport {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const std::string& name() const = 0;
  // Called before every operation: work on `cuda_stream` (a cudaStream_t; nullptr = the legacy
  // default stream) that produced the inputs must be ordered before it (NCCL). No-op on CPU.
  virtual void wait_for_producer(void* /*cuda_stream*/) {}
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // `buffer` holds size chunks; chunk r is member r's contribution (this member's already there).
  virtual void all_gather_in_place(at::Tensor& buffer) = 0;
  // In place; the result is on `root` only (other members' tensor is left unspecified).
  virtual void reduce(at::Tensor& tensor, int root, ReduceOp op) = 0;
  virtual void all_gather_uneven(const at::Tensor& input, at::Tensor& output, const std::vector<int64_t>& counts) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  virtual void all_to_all(const at::Tensor& input, at::Tensor& output) = 0;
  virtual void send(const at::Tensor& tensor, int dst, uint32_t tag) = 0;
  virtual void recv(at::Tensor& tensor, int src, uint32_t tag) = 0;
  virtual void barrier() = 0;
  // A backend of the same kind over a sub-group (collective over its members).
  virtual std::unique_ptr<Backend> make_group(std::shared_ptr<Store> store, int rank, int size,
                                              const CommunicatorOptions& options) = 0;
};

// Factories, one per backend file.
std::unique_ptr<Backend> make_gloo_backend(std::shared_ptr<Store> store, int rank, int size,
                                           const CommunicatorOptions& options);
std::unique_ptr<Backend> make_nccl_backend(std::shared_ptr<Store> store, int rank, int size, int device,
                                           const CommunicatorOptions& options);

}  // namespace tessera::transport
