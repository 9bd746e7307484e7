// FlatParameters packs a module's parameters into one flat buffer (and their gradients into a
// second one of the same layout), so every parameter and every .grad is a view of a flat buffer.
//
// Why: ZeRO partitions, reduces and updates flat ranges, never individual tensors. With the
// parameters as views, an optimizer step on a partition of the flat buffer writes the module's
// weights in place; with the gradients as views, autograd accumulates straight into the flat
// gradient buffer (AccumulateGrad adds in place into a defined .grad), so buckets are plain
// ranges of it and no copy is needed ("contiguous gradients").
//
// Invariants: parameters keep their TensorImpl, autograd meta and version counter (set_data);
// the flat buffers are padded as the FlatGroupLayout says and the padding stays zero in the
// gradient buffer. zero_grad() zeroes the gradient buffer and keeps the views.
//
// Without flat gradients (ZeRO-2 with partitioned gradients) there is no gradient buffer: autograd
// allocates each .grad, whoever consumes it releases it, and zero_grad() releases them all.
//
// Example: Linear(4, 3) has weight [3, 4] and bias [3]: 15 elements; at dp 2 with alignment 1
// the buffers hold 16 elements, weight at [0, 12), bias at [12, 15), padding at 15.
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
  // buffer laid out for `dp_size` ranks, then re-points every parameter at its slice. With
  // `dtype` set, the buffers have that dtype and the values are rounded to it (a bf16 or fp16
  // model made from fp32 weights, as DeepSpeed converts the module).
  FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, int64_t dp_size,
                 int64_t alignment_elements = 1, std::optional<at::ScalarType> dtype = std::nullopt,
                 bool flat_gradients = true);

  const FlatGroupLayout& layout() const { return layout_; }
  const at::Tensor& buffer() const { return buffer_; }            // [padded_numel]
  const at::Tensor& grad_buffer() const { return grad_buffer_; }  // [padded_numel]; undefined without
  bool flat_gradients() const { return grad_buffer_.defined(); }
  const std::vector<at::Tensor>& parameters() const { return parameters_; }

  // This rank's slice of the parameters / gradients ([partition_numel] views).
  at::Tensor partition(int64_t rank) const;
  at::Tensor grad_partition(int64_t rank) const;

  // Zeroes the gradient buffer (and re-attaches any .grad a user replaced or reset); without
  // flat gradients, resets every .grad.
  void zero_grad();

  // True when every parameter's .grad is still a view of the gradient buffer (a user who
  // assigned p.grad() a new tensor broke contiguity; the engine refuses to reduce then).
  bool gradients_attached() const;

 private:
  void attach_gradients();
  FlatGroupLayout layout_;
  at::Tensor buffer_;
  at::Tensor grad_buffer_;
  std::vector<at::Tensor> parameters_;
};

}  // namespace tessera::zero
