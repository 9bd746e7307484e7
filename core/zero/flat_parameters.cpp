#include "core/zero/flat_parameters.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include "core/error.h"

namespace tessera::zero {

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                               int64_t dp_size, int64_t alignment_elements, std::optional<at::ScalarType> dtype,
                               bool flat_gradients) {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  for (const auto& [name, p] : named_parameters) {
    if (!p.defined()) throw Error("flat parameters: parameter '" + name + "' is undefined");
    if (p.scalar_type() != named_parameters.front().second.scalar_type())
      throw Error("flat parameters: parameter '" + name + "' is " + std::string(c10::toString(p.scalar_type())) +
                  " but '" + named_parameters.front().first + "' is " +
                  c10::toString(named_parameters.front().second.scalar_type()) + "; one group holds one dtype");
    names.push_back(name);
    numels.push_back(p.numel());
  }
  layout_ = make_flat_group_layout(names, numels, dp_size, alignment_elements);
  auto options = named_parameters.empty() ? at::TensorOptions(at::kFloat)
                                          : named_parameters.front().second.options().requires_grad(false);
  if (dtype) options = options.dtype(*dtype);
  buffer_ = at::zeros({layout_.padded_numel}, options);
  if (flat_gradients) grad_buffer_ = at::zeros({layout_.padded_numel}, options);
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < named_parameters.size(); ++i) {
    const auto& p = named_parameters[i].second;
    const auto& slot = layout_.params[i];
    auto view = buffer_.narrow(0, slot.offset, slot.numel).view(p.sizes());
    view.copy_(p.detach());
    // set_data swaps storage and metadata but keeps the TensorImpl (module and optimizer handles
    // stay valid), its autograd meta and its version counter.
    at::Tensor param = p;
    param.set_data(view);
    parameters_.push_back(param);
  }
  attach_gradients();
}

void FlatParameters::attach_gradients() {
  if (!grad_buffer_.defined()) {
    for (auto& p : parameters_) p.mutable_grad() = at::Tensor();
    return;
  }
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& slot = layout_.params[i];
    parameters_[i].mutable_grad() = grad_buffer_.narrow(0, slot.offset, slot.numel).view(parameters_[i].sizes());
  }
}

at::Tensor FlatParameters::partition(int64_t rank) const {
  return buffer_.narrow(0, layout_.partition_begin(rank), layout_.partition_numel);
}

at::Tensor FlatParameters::grad_partition(int64_t rank) const {
  if (!grad_buffer_.defined()) throw Error("flat parameters: no flat gradient buffer (gradients are partitioned)");
  return grad_buffer_.narrow(0, layout_.partition_begin(rank), layout_.partition_numel);
}

bool FlatParameters::gradients_attached() const {
  if (!grad_buffer_.defined()) return true;
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& g = parameters_[i].grad();
    const auto* expected = static_cast<const char*>(grad_buffer_.data_ptr()) +
                           layout_.params[i].offset * grad_buffer_.element_size();
    if (!g.defined() || g.data_ptr() != expected || !g.is_contiguous()) return false;
  }
  return true;
}

void FlatParameters::zero_grad() {
  if (!grad_buffer_.defined()) {
    attach_gradients();  // releases every .grad
    return;
  }
  grad_buffer_.zero_();
  if (!gradients_attached()) attach_gradients();
}

}  // namespace tessera::zero
