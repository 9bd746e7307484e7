// FlatParameters packs a module's parameters into one flat buffer, so every parameter is a view
// of it: ZeRO partitions, reduces and updates flat ranges, never individual tensors, and with the
// parameters as views an optimizer step on a partition writes the module's weights in place.
//
// Invariants: parameters keep their TensorImpl, autograd meta and version counter (set_data); the
// buffer is padded as the FlatGroupLayout says. Gradients live elsewhere (FlatGradients, or
// autograd's own .grad tensors when they are partitioned). The buffer is allocated on the
// parameters' device.
//
// Example: Linear(4, 3) has weight [3, 4] and bias [3]: 15 elements; at dp 2 with alignment 1
// the buffer holds 16 elements, weight at [0, 12), bias at [12, 15), padding at 15.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/zero/flat_group_layout.h"

namespace tessera::zero {

class FlatParameters {
 public:
  // Copies the values of `named_parameters` (all of one dtype, contiguous or not) into a new flat
  // buffer laid out as `layout` (made for these parameters, in this order), then re-points every
  // parameter at its slice. With `dtype` set, the buffer has that dtype and the values are
  // rounded to it (a bf16 or fp16 model made from fp32 weights, as DeepSpeed converts the module).
  FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, FlatGroupLayout layout,
                 std::optional<at::ScalarType> dtype = std::nullopt);
  // The same with a layout made here for `dp_size` ranks.
  FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, int64_t dp_size,
                 int64_t alignment_elements = 1, std::optional<at::ScalarType> dtype = std::nullopt);

  const FlatGroupLayout& layout() const { return layout_; }
  const at::Tensor& buffer() const { return buffer_; }  // [padded_numel]
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

  // This rank's slice ([partition_numel] view).
  at::Tensor partition(int64_t rank) const;

 private:
  FlatGroupLayout layout_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
};

// FlatGradients is a gradient buffer laid out like a FlatParameters, with every parameter's .grad
// a view of it, so autograd accumulates straight into it (AccumulateGrad adds in place into a
// defined .grad) and buckets are plain ranges of it ("contiguous gradients"). The padding stays
// zero. zero() zeroes it and re-attaches any .grad a user replaced or reset.
class FlatGradients {
 public:
  explicit FlatGradients(const FlatParameters& parameters);

  const at::Tensor& buffer() const { return buffer_; }  // [padded_numel]
  at::Tensor partition(int64_t rank) const;
  void zero();
  // True when every parameter's .grad is still a view of the buffer (a user who assigned p.grad()
  // a new tensor broke contiguity; the engine refuses to reduce then).
  bool attached() const;

 private:
  void attach();
  FlatGroupLayout layout_;
  at::Tensor buffer_;
  std::vector<at::Tensor> parameters_;
};

}  // namespace tessera::zero
