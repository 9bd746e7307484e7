// The optimizer kinds, each written to repeat LibTorch 1.13's torch::optim::<Kind>::step() for one
// parameter, operation by operation (same ATen ops, same scalar types, same order), so that a
// partitioned update is bitwise the unpartitioned one. Where LibTorch allocates a temporary
// (grad.add(p, wd), exp_avg_sq.sqrt() / c), the same operation writes into a workspace buffer.
#include "core/optim/optimizer_kernel.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "core/error.h"
#include "core/optim/fused_adam.h"

namespace tessera::optim {

at::Tensor Workspace::get(size_t slot, int64_t elements, const at::TensorOptions& options) {
  if (slots_.size() <= slot) slots_.resize(slot + 1);
  auto& t = slots_[slot];
  if (!t.defined() || t.numel() < elements || t.scalar_type() != options.dtype().toScalarType() ||
      t.device() != options.device()) {
    t = at::empty({elements}, options);
    ++allocations_;
  }
  return t.narrow(0, 0, elements);
}

int64_t Workspace::bytes() const {
  int64_t n = 0;
  for (const auto& t : slots_)
    if (t.defined()) n += int64_t(t.numel() * t.element_size());
  return n;
}

std::vector<at::Tensor> OptimizerKernel::initial_states(const at::Tensor& p) const {
  std::vector<at::Tensor> out;
  for (size_t i = 0; i < state_names().size(); ++i)
    out.push_back(at::zeros_like(p, options_.bf16_states ? p.options().dtype(at::kBFloat16) : p.options(),
                                 at::MemoryFormat::Preserve));
  return out;
}

void OptimizerKernel::check_inputs(const at::Tensor& param, const at::Tensor& grad, const std::vector<at::Tensor>& states,
                                   const char* kind) const {
  if (!param.defined() || !grad.defined())
    throw Error(std::string(kind) + " step: parameter partition or its gradient is undefined");
  if (param.numel() != grad.numel() || param.scalar_type() != grad.scalar_type()) {
    std::ostringstream msg;
    msg << kind << " step: gradient (" << grad.numel() << " elements, " << grad.scalar_type()
        << ") does not match the parameter partition (" << param.numel() << " elements, " << param.scalar_type() << ")";
    throw Error(msg.str());
  }
  const auto names = state_names();
  if (states.size() != names.size())
    throw Error(std::string(kind) + " step: expected " + std::to_string(names.size()) + " states, got " +
                std::to_string(states.size()));
  for (size_t i = 0; i < states.size(); ++i)
    if (!states[i].defined() || states[i].numel() != param.numel())
      throw Error(std::string(kind) + " step: state '" + names[i] + "' has " +
                  (states[i].defined() ? std::to_string(states[i].numel()) : std::string("no")) +
                  " elements but the partition has " + std::to_string(param.numel()) + " elements");
}

namespace {

// grad.add(p, weight_decay) (L2 decay folded into the gradient), written into workspace `slot`;
// the gradient itself when there is no decay.
at::Tensor l2_decayed(const at::Tensor& grad, const at::Tensor& p, double weight_decay, Workspace& ws, size_t slot) {
  if (weight_decay == 0) return grad;
  auto out = ws.get(slot, p.numel(), p.options());
  at::add_out(out, grad, p, weight_decay);
  return out;
}

void check_step(int64_t step, const char* kind) {
  if (step < 1) throw Error(std::string(kind) + " step: update number " + std::to_string(step) + " < 1");
}

// torch::optim::Adam (L2) and torch::optim::AdamW (decoupled). fp32 runs without amsgrad go
// through the fused kernel (bitwise the ATen ops below, in one pass); the rest through ATen.
class AdamKernel final : public OptimizerKernel {
  bool fusable(const at::Tensor& p, const at::Tensor& grad, const std::vector<at::Tensor>& states) const {
    if (options_.amsgrad || options_.bf16_states) return false;
    for (const auto* t : {&p, &grad, &states[0], &states[1]})
      if (t->scalar_type() != at::kFloat || !t->is_contiguous() || !t->device().is_cpu()) return false;
    return true;
  }

 public:
  explicit AdamKernel(const OptimizerOptions& o) : OptimizerKernel(o) {}
  std::vector<std::string> state_names() const override {
    if (options_.amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }
  void step(const at::Tensor& p, const at::Tensor& grad_in, const std::vector<at::Tensor>& states, int64_t step,
            const StepHyperparameters& hp, Workspace& ws) const override {
    check_inputs(p, grad_in, states, "Adam");
    check_step(step, "Adam");
    at::NoGradGuard no_grad;
    const bool decoupled = options_.kind == OptimizerKind::AdamW;
    if (fusable(p, grad_in, states)) {  // the same bits in one pass (fused_adam.h)
      FusedAdamRun run;
      run.param = p.data_ptr<float>(), run.grad = grad_in.data_ptr<float>();
      run.exp_avg = states[0].data_ptr<float>(), run.exp_avg_sq = states[1].data_ptr<float>();
      run.elements = p.numel();
      FusedAdamStep s;
      s.lr = hp.lr, s.beta1 = hp.beta1, s.beta2 = hp.beta2, s.eps = options_.eps, s.weight_decay = options_.weight_decay;
      s.decay = decoupled ? AdamDecay::decoupled : AdamDecay::l2, s.step = step;
      return fused_adam(run, s);
    }
    if (decoupled && options_.weight_decay != 0) p.mul_(1 - hp.lr * options_.weight_decay);
    const auto& exp_avg = states[0];
    const auto& exp_avg_sq = states[1];
    const double beta1 = hp.beta1, beta2 = hp.beta2;
    const auto bias_correction1 = 1 - std::pow(beta1, step);
    const auto bias_correction2 = 1 - std::pow(beta2, step);
    const at::Tensor grad = l2_decayed(grad_in, p, decoupled ? 0.0 : options_.weight_decay, ws, 1);
    exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    auto denom = ws.get(0, p.numel(), p.options());
    if (options_.amsgrad) {
      at::Tensor max_exp_avg_sq = states[2];
      at::max_out(max_exp_avg_sq, exp_avg_sq, max_exp_avg_sq);
      at::sqrt_out(denom, max_exp_avg_sq);
    } else {
      at::sqrt_out(denom, exp_avg_sq);
    }
    denom.div_(std::sqrt(bias_correction2)).add_(options_.eps);  // (sqrt(v) / sqrt(bc2)).add_(eps)
    const auto step_size = hp.lr / bias_correction1;
    p.addcdiv_(exp_avg, denom, -step_size);
  }
};

// torch::optim::SGD. LibTorch creates the momentum buffer at the first step as a copy of d_p;
// here it exists from the start and the first step copies into it.
class SgdKernel final : public OptimizerKernel {
 public:
  explicit SgdKernel(const OptimizerOptions& o) : OptimizerKernel(o) {}
  std::vector<std::string> state_names() const override {
    if (options_.momentum != 0) return {"momentum_buffer"};
    return {};
  }
  void step(const at::Tensor& p, const at::Tensor& grad, const std::vector<at::Tensor>& states, int64_t step,
            const StepHyperparameters& hp, Workspace& ws) const override {
    check_inputs(p, grad, states, "SGD");
    check_step(step, "SGD");
    at::NoGradGuard no_grad;
    at::Tensor d_p = l2_decayed(grad, p, options_.weight_decay, ws, 0);
    if (options_.momentum != 0) {
      const auto& buf = states[0];
      if (step == 1) buf.copy_(d_p);  // clone(d_p) (rounded once in bf16 states)
      else buf.mul_(options_.momentum).add_(d_p, 1 - options_.dampening);
      if (options_.nesterov) {
        auto out = ws.get(0, p.numel(), p.options());
        at::add_out(out, d_p, buf, options_.momentum);  // d_p.add(buf, momentum)
        d_p = out;
      } else {
        d_p = buf;
      }
    }
    p.add_(d_p, -1 * hp.lr);
  }
};

// torch::optim::Adagrad (dense gradients).
class AdagradKernel final : public OptimizerKernel {
 public:
  explicit AdagradKernel(const OptimizerOptions& o) : OptimizerKernel(o) {}
  std::vector<std::string> state_names() const override { return {"sum"}; }
  std::vector<at::Tensor> initial_states(const at::Tensor& p) const override {
    auto states = OptimizerKernel::initial_states(p);
    states[0].fill_(options_.initial_accumulator_value);
    return states;
  }
  void step(const at::Tensor& p, const at::Tensor& grad_in, const std::vector<at::Tensor>& states, int64_t step,
            const StepHyperparameters& hp, Workspace& ws) const override {
    check_inputs(p, grad_in, states, "Adagrad");
    check_step(step, "Adagrad");
    at::NoGradGuard no_grad;
    const at::Tensor grad = l2_decayed(grad_in, p, options_.weight_decay, ws, 1);
    const auto clr = hp.lr / (1 + static_cast<double>(step - 1) * options_.lr_decay);
    states[0].addcmul_(grad, grad, 1.0);
    auto std_dev = ws.get(0, p.numel(), p.options());
    at::sqrt_out(std_dev, states[0]);
    std_dev.add_(options_.eps);  // sum.sqrt().add_(eps)
    p.addcdiv_(grad, std_dev, -clr);
  }
};

// Lion: update = sign(beta1 m + (1 - beta1) g); p -= lr (update + wd p); m = beta2 m + (1 - beta2) g.
class LionKernel final : public OptimizerKernel {
 public:
  explicit LionKernel(const OptimizerOptions& o) : OptimizerKernel(o) {}
  std::vector<std::string> state_names() const override { return {"exp_avg"}; }
  void step(const at::Tensor& p, const at::Tensor& grad, const std::vector<at::Tensor>& states, int64_t step,
            const StepHyperparameters& hp, Workspace& ws) const override {
    check_inputs(p, grad, states, "Lion");
    check_step(step, "Lion");
    at::NoGradGuard no_grad;
    const auto& exp_avg = states[0];
    if (options_.weight_decay != 0) p.mul_(1 - hp.lr * options_.weight_decay);
    auto update = ws.get(0, p.numel(), exp_avg.options());  // exp_avg.mul(beta1), in exp_avg's dtype
    update.copy_(exp_avg).mul_(hp.beta1).add_(grad, 1 - hp.beta1).sign_();
    p.add_(update, -hp.lr);
    exp_avg.mul_(hp.beta2).add_(grad, 1 - hp.beta2);
  }
};

void require(bool ok, const std::string& field, double value, const std::string& expected) {
  if (ok) return;
  std::ostringstream msg;
  msg << "optimizer.params." << field << " = " << value << ": expected " << expected;
  throw ConfigError(msg.str());
}

}  // namespace

std::unique_ptr<OptimizerKernel> make_optimizer_kernel(const OptimizerOptions& o) {
  require(std::isfinite(o.lr) && o.lr >= 0, "lr", o.lr, "a finite value >= 0");
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight_decay", o.weight_decay, "a value >= 0");
  switch (o.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      require(o.beta1 >= 0 && o.beta1 < 1, "betas[0]", o.beta1, "a value in [0, 1)");
      require(o.beta2 >= 0 && o.beta2 < 1, "betas[1]", o.beta2, "a value in [0, 1)");
      require(o.eps >= 0, "eps", o.eps, "a value >= 0");
      return std::make_unique<AdamKernel>(o);
    case OptimizerKind::SGD:
      require(o.momentum >= 0, "momentum", o.momentum, "a value >= 0");
      require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "dampening", o.dampening,
              "0 with momentum > 0 when nesterov is true");
      return std::make_unique<SgdKernel>(o);
    case OptimizerKind::Adagrad:
      require(o.lr_decay >= 0, "lr_decay", o.lr_decay, "a value >= 0");
      require(o.initial_accumulator_value >= 0, "initial_accumulator_value", o.initial_accumulator_value,
              "a value >= 0");
      require(o.eps >= 0, "eps", o.eps, "a value >= 0");
      return std::make_unique<AdagradKernel>(o);
    case OptimizerKind::Lion:
      require(o.beta1 >= 0 && o.beta1 <= 1, "betas[0]", o.beta1, "a value in [0, 1]");
      require(o.beta2 >= 0 && o.beta2 <= 1, "betas[1]", o.beta2, "a value in [0, 1]");
      return std::make_unique<LionKernel>(o);
  }
  throw ConfigError("optimizer.type: unknown optimizer kind");
}

}  // namespace tessera::optim
