// Partitioned construction (DeepSpeed's zero.Init, Accelerate's zero3_init_flag): inside a
// PartitionedConstruction scope, the parameters of every module a tessera::Unit holder is given
// are cut as soon as the holder gets the module: this rank keeps 1/W of each (flattened, in W equal
// chunks, the last padded with zeros) and the full storage is freed. So a model larger than one
// rank's share can be built, one module at a time. A stage-3 initialize then builds each unit from
// the ranks' chunks (an all-gather per parameter), never holding more than one unit whole.
//
// The same seed gives the same weights as plain construction when the values are made in the
// modules' constructors (LibTorch's own initialisation): cutting consumes no random numbers. An
// init loop that runs after construction (TinyGpt's, DecoderLm's) writes a cut parameter through
// write_constructed(): it makes the value whole, one parameter at a time, and keeps this rank's
// chunk; anything else writing a cut parameter crashes (it has no memory). Only stage 3 takes
// such a model.
//
//   { tessera::zero::PartitionedConstruction scope;   // W and rank from tessera-launch
//     model = std::make_shared<Net>(); }
//   auto engine = tessera::initialize(model, stage3_config).engine;
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>

namespace torch::nn {
class Module;
}

namespace tessera::zero {

class PartitionedConstruction {
 public:
  // world/rank < 0: from tessera-launch's environment (WORLD_SIZE, RANK).
  explicit PartitionedConstruction(int world = -1, int rank = -1);
  ~PartitionedConstruction();
  PartitionedConstruction(const PartitionedConstruction&) = delete;
  PartitionedConstruction& operator=(const PartitionedConstruction&) = delete;

 private:
  PartitionedConstruction* outer_;
  int world_, rank_;
  friend void partition_if_constructing(const std::shared_ptr<torch::nn::Module>& module);
};

// This rank's chunk of a parameter cut at construction.
struct ConstructedChunk {
  int world = 1;
  int rank = 0;
  int64_t numel = 0;  // of the whole parameter
  at::Tensor chunk;   // [ceil(numel / world)], the parameter's dtype
};

// Called by unit holders: cuts `module`'s own parameters when a scope is active on this thread.
void partition_if_constructing(const std::shared_ptr<torch::nn::Module>& module);
// Cuts one parameter as a scope would (rank r of W keeps its chunk; the whole's storage is freed);
// nothing when it was cut already. For constructions a unit holder does not see (Python's zero.Init).
void partition_parameter(const at::Tensor& parameter, int world, int rank);
// The chunk of a parameter cut at construction, if it was.
std::optional<ConstructedChunk> constructed_chunk(const at::Tensor& parameter);
// If `parameter` was cut: copies this rank's chunk of `value` (the whole parameter's new value,
// its shape) into the chunk and returns true; false for a parameter that was not cut.
bool write_constructed(const at::Tensor& parameter, const at::Tensor& value);
// Drops the chunk (after initialize used it).
void forget_constructed(const at::Tensor& parameter);

}  // namespace tessera::zero
