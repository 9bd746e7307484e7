#include "core/nn/activation_checkpoint.h"

#include <torch/torch.h>

namespace tessera::nn {
namespace {

struct FnHolder : torch::CustomClassHolder {
  explicit FnHolder(CheckpointFn f) : fn(std::move(f)) {}
  CheckpointFn fn;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // Tensor arguments (inputs, then params) are the node's edges; backward returns one gradient per
  // argument: none for the holder, then the inputs', then the parameters'.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, c10::IValue holder,
                                                at::TensorList inputs, at::TensorList params) {
    ctx->saved_data["fn"] = holder;
    ctx->saved_data["inputs"] = int64_t(inputs.size());
    std::vector<at::Tensor> saved = inputs.vec();
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    // Grad mode is off here (Function::apply): nothing inside the block is recorded.
    return static_cast<FnHolder&>(*holder.toCapsule()).fn(inputs.vec());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto holder = ctx->saved_data["fn"].toCapsule();
    const auto& fn = static_cast<FnHolder&>(*holder).fn;
    const auto saved = ctx->get_saved_variables();
    const size_t n_inputs = size_t(ctx->saved_data["inputs"].toInt());
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < n_inputs; ++i) inputs.push_back(saved[i].detach().requires_grad_(saved[i].requires_grad()));
    std::vector<at::Tensor> outputs;
    {
      torch::AutoGradMode grad(true);
      outputs = fn(inputs);
    }
    std::vector<at::Tensor> differentiated, output_grads, wrt;
    std::vector<size_t> slot;  // where each of `wrt`'s gradients goes in the returned list
    for (size_t i = 0; i < outputs.size() && i < grad_outputs.size(); ++i) {
      if (!outputs[i].requires_grad()) continue;
      differentiated.push_back(outputs[i]);
      output_grads.push_back(grad_outputs[i].defined() ? grad_outputs[i] : torch::zeros_like(outputs[i]));
    }
    for (size_t i = 0; i < saved.size(); ++i) {
      const auto& t = i < n_inputs ? inputs[i] : saved[i];
      if (t.requires_grad()) wrt.push_back(t), slot.push_back(1 + i);
    }
    torch::autograd::variable_list out(1 + saved.size());
    if (differentiated.empty() || wrt.empty()) return out;
    // The recomputation's own backward: it returns gradients and accumulates into no .grad.
    auto grads = torch::autograd::grad(differentiated, wrt, output_grads, /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
    for (size_t k = 0; k < wrt.size(); ++k) out[slot[k]] = grads[k];
    return out;
  }
};

}  // namespace

std::vector<at::Tensor> checkpoint(const CheckpointFn& fn, const std::vector<at::Tensor>& inputs,
                                   const std::vector<at::Tensor>& params) {
  bool needs_grad = false;
  for (const auto& t : inputs) needs_grad = needs_grad || t.requires_grad();
  for (const auto& t : params) needs_grad = needs_grad || t.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs_grad) return fn(inputs);
  // As TensorLists: apply() finds the tensors (the node's edges) only in Tensor and TensorList arguments.
  return CheckpointFunction::apply(c10::IValue::make_capsule(c10::make_intrusive<FnHolder>(fn)), at::TensorList(inputs),
                                   at::TensorList(params));
}

at::Tensor checkpoint(torch::nn::Module& block, const std::function<at::Tensor(const at::Tensor&)>& fn, const at::Tensor& x) {
  std::vector<at::Tensor> params;
  for (const auto& p : block.parameters())
    if (p.requires_grad()) params.push_back(p);
  auto f = fn;  // kept by the node until its backward
  return checkpoint([f](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{f(in[0])}; }, {x}, params)[0];
}

}  // namespace tessera::nn
