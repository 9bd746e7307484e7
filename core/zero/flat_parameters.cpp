#include "core/zero/flat_parameters.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include "core/error.h"

namespace tessera::zero {
namespace {

FlatGroupLayout layout_for(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters, int64_t dp_size,
                           int64_t alignment_elements) {
  std::vector<std::string> names;
  std::vector<int64_t> numels;
  for (const auto& [name, p] : named_parameters) {
    if (!p.defined()) throw Error("flat parameters: parameter '" + name + "' is undefined");
    names.push_back(name);
    numels.push_back(p.numel());
  }
  return make_flat_group_layout(names, numels, dp_size, alignment_elements);
}

}  // namespace

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                               int64_t dp_size, int64_t alignment_elements, std::optional<at::ScalarType> dtype)
    : FlatParameters(named_parameters, layout_for(named_parameters, dp_size, alignment_elements), dtype) {}

FlatParameters::FlatParameters(const std::vector<std::pair<std::string, at::Tensor>>& named_parameters,
                               FlatGroupLayout layout, std::optional<at::ScalarType> dtype)
    : layout_(std::move(layout)) {
  if (layout_.params.size() != named_parameters.size())
    throw Error("flat parameters: the layout has " + std::to_string(layout_.params.size()) + " parameters, " +
                std::to_string(named_parameters.size()) + " given");
  for (size_t i = 0; i < named_parameters.size(); ++i) {
    const auto& [name, p] = named_parameters[i];
    if (!p.defined()) throw Error("flat parameters: parameter '" + name + "' is undefined");
    if (p.numel() != layout_.params[i].numel || name != layout_.params[i].name)
      throw Error("flat parameters: parameter '" + name + "' (" + std::to_string(p.numel()) +
                  " elements) is not the layout's '" + layout_.params[i].name + "'");
    if (p.scalar_type() != named_parameters.front().second.scalar_type())
      throw Error("flat parameters: parameter '" + name + "' is " + std::string(c10::toString(p.scalar_type())) +
                  " but '" + named_parameters.front().first + "' is " +
                  c10::toString(named_parameters.front().second.scalar_type()) + "; one group holds one dtype");
  }
  auto options = named_parameters.empty() ? at::TensorOptions(at::kFloat)
                                          : named_parameters.front().second.options().requires_grad(false);
  if (dtype) options = options.dtype(*dtype);
  buffer_ = at::zeros({layout_.padded_numel}, options);
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
}

at::Tensor FlatParameters::partition(int64_t rank) const {
  return buffer_.narrow(0, layout_.partition_begin(rank), layout_.partition_numel);
}

FlatGradients::FlatGradients(const FlatParameters& parameters)
    : layout_(parameters.layout()), parameters_(parameters.parameters()) {
  buffer_ = at::zeros({layout_.padded_numel}, parameters.buffer().options());
  attach();
}

void FlatGradients::attach() {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& slot = layout_.params[i];
    parameters_[i].mutable_grad() = buffer_.narrow(0, slot.offset, slot.numel).view(parameters_[i].sizes());
  }
}

at::Tensor FlatGradients::partition(int64_t rank) const {
  return buffer_.narrow(0, layout_.partition_begin(rank), layout_.partition_numel);
}

bool FlatGradients::attached() const {
  for (size_t i = 0; i < parameters_.size(); ++i) {
    const auto& g = parameters_[i].grad();
    const auto* expected = static_cast<const char*>(buffer_.data_ptr()) + layout_.params[i].offset * buffer_.element_size();
    if (!g.defined() || g.data_ptr() != expected || !g.is_contiguous()) return false;
  }
  return true;
}

void FlatGradients::zero() {
  buffer_.zero_();
  if (!attached()) attach();
}

}  // namespace tessera::zero
