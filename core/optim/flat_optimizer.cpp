// The optimizer kinds, each written to repeat LibTorch 1.13's torch::optim::<Kind>::step() for one
// parameter, operation by operation (same ATen ops, same scalar types, same order), so that a
// partitioned update is bitwise the unpartitioned one.
#include "core/optim/flat_optimizer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace tessera::optim {
namespace {

void check_step_inputs(const at::Tensor& param, const at::Tensor& grad, const char* kind) {
  if (!param.defined() || !grad.defined())
    throw Error(std::string(kind) + " step: parameter partition or its gradient is undefined");
  if (param.numel() != grad.numel() || param.scalar_type() != grad.scalar_type()) {
    std::ostringstream msg;
    msg << kind << " step: gradient (" << grad.numel() << " elements, " << grad.scalar_type()
        << ") does not match the parameter partition (" << param.numel() << " elements, "
        << param.scalar_type() << ")";
    throw Error(msg.str());
  }
}

// Shared bookkeeping: named states, created lazily, replaced by load_states.
class StatefulOptimizer : public FlatOptimizer {
 public:
  StatefulOptimizer(const OptimizerOptions& options, std::vector<std::string> names)
      : FlatOptimizer(options), names_(std::move(names)), states_(names_.size()) {}

  std::vector<std::string> state_names() const override { return names_; }
  std::vector<at::Tensor> states() const override { return states_; }

  void load_states(const std::vector<at::Tensor>& states, int64_t steps_taken) override {
    if (states.size() != names_.size())
      throw Error("load_states: expected " + std::to_string(names_.size()) + " states, got " +
                  std::to_string(states.size()));
    for (size_t i = 0; i < states.size(); ++i) {
      if (!states[i].defined()) throw Error("load_states: state '" + names_[i] + "' is undefined");
      if (states[i].numel() != states[0].numel())
        throw Error("load_states: state '" + names_[i] + "' has " + std::to_string(states[i].numel()) +
                    " elements, '" + names_[0] + "' has " + std::to_string(states[0].numel()));
    }
    if (steps_taken < 0) throw Error("load_states: negative step count " + std::to_string(steps_taken));
    states_ = states;
    steps_taken_ = steps_taken;
  }

 protected:
  bool initialized() const { return states_.empty() || states_[0].defined(); }
  // A zero state shaped like the partition, in bf16 when the options ask for it.
  at::Tensor zero_state(const at::Tensor& p) const {
    return at::zeros_like(p, options_.bf16_states ? p.options().dtype(at::kBFloat16) : p.options(),
                          at::MemoryFormat::Preserve);
  }
  void check_state_length(const at::Tensor& param) const {
    if (states_.empty() || !states_[0].defined() || states_[0].numel() == param.numel()) return;
    throw Error("step: optimizer states have " + std::to_string(states_[0].numel()) +
                " elements but the partition has " + std::to_string(param.numel()) + " elements");
  }
  std::vector<std::string> names_;
  std::vector<at::Tensor> states_;
};

// torch::optim::Adam (L2) and torch::optim::AdamW (decoupled).
class AdamOptimizer final : public StatefulOptimizer {
 public:
  explicit AdamOptimizer(const OptimizerOptions& o)
      : StatefulOptimizer(o, o.amsgrad ? std::vector<std::string>{"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}
                                       : std::vector<std::string>{"exp_avg", "exp_avg_sq"}) {}

  void step(const at::Tensor& p, const at::Tensor& grad_in, const StepHyperparameters& hp) override {
    check_step_inputs(p, grad_in, "Adam");
    check_state_length(p);
    at::NoGradGuard no_grad;
    const bool decoupled = options_.kind == OptimizerKind::AdamW;
    if (decoupled && options_.weight_decay != 0) p.mul_(1 - hp.lr * options_.weight_decay);
    if (!initialized()) {
      for (auto& s : states_) s = zero_state(p);
    }
    auto& exp_avg = states_[0];
    auto& exp_avg_sq = states_[1];
    ++steps_taken_;
    const double beta1 = hp.beta1, beta2 = hp.beta2;
    const auto bias_correction1 = 1 - std::pow(beta1, steps_taken_);
    const auto bias_correction2 = 1 - std::pow(beta2, steps_taken_);
    at::Tensor grad = grad_in;
    if (!decoupled && options_.weight_decay != 0) grad = grad.add(p, options_.weight_decay);
    exp_avg.mul_(beta1).add_(grad, 1 - beta1);
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2);
    at::Tensor denom;
    if (options_.amsgrad) {
      auto& max_exp_avg_sq = states_[2];
      at::max_out(max_exp_avg_sq, exp_avg_sq, max_exp_avg_sq);
      denom = (max_exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    } else {
      denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(options_.eps);
    }
    const auto step_size = hp.lr / bias_correction1;
    p.addcdiv_(exp_avg, denom, -step_size);
  }
};

// torch::optim::SGD.
class SgdOptimizer final : public StatefulOptimizer {
 public:
  explicit SgdOptimizer(const OptimizerOptions& o)
      : StatefulOptimizer(o, o.momentum != 0 ? std::vector<std::string>{"momentum_buffer"}
                                             : std::vector<std::string>{}) {}

  void step(const at::Tensor& p, const at::Tensor& grad, const StepHyperparameters& hp) override {
    check_step_inputs(p, grad, "SGD");
    check_state_length(p);
    at::NoGradGuard no_grad;
    at::Tensor d_p = grad;
    if (options_.weight_decay != 0) d_p = d_p.add(p, options_.weight_decay);
    if (options_.momentum != 0) {
      auto& buf = states_[0];
      if (!buf.defined()) {
        buf = options_.bf16_states ? d_p.to(at::kBFloat16) : at::clone(d_p).detach();
      } else {
        buf.mul_(options_.momentum).add_(d_p, 1 - options_.dampening);
      }
      d_p = options_.nesterov ? d_p.add(buf, options_.momentum) : buf;
    }
    p.add_(d_p, -1 * hp.lr);
    ++steps_taken_;
  }
};

// torch::optim::Adagrad (dense gradients).
class AdagradOptimizer final : public StatefulOptimizer {
 public:
  explicit AdagradOptimizer(const OptimizerOptions& o) : StatefulOptimizer(o, {"sum"}) {}

  void step(const at::Tensor& p, const at::Tensor& grad_in, const StepHyperparameters& hp) override {
    check_step_inputs(p, grad_in, "Adagrad");
    check_state_length(p);
    at::NoGradGuard no_grad;
    if (!initialized())
      states_[0] = zero_state(p).fill_(options_.initial_accumulator_value);
    ++steps_taken_;
    at::Tensor grad = grad_in;
    if (options_.weight_decay != 0) grad = grad.add(p, options_.weight_decay);
    const auto clr = hp.lr / (1 + static_cast<double>(steps_taken_ - 1) * options_.lr_decay);
    states_[0].addcmul_(grad, grad, 1.0);
    const auto std_dev = states_[0].sqrt().add_(options_.eps);
    p.addcdiv_(grad, std_dev, -clr);
  }
};

// Lion: update = sign(beta1 m + (1 - beta1) g); p -= lr (update + wd p); m = beta2 m + (1 - beta2) g.
class LionOptimizer final : public StatefulOptimizer {
 public:
  explicit LionOptimizer(const OptimizerOptions& o) : StatefulOptimizer(o, {"exp_avg"}) {}

  void step(const at::Tensor& p, const at::Tensor& grad, const StepHyperparameters& hp) override {
    check_step_inputs(p, grad, "Lion");
    check_state_length(p);
    at::NoGradGuard no_grad;
    if (!initialized()) states_[0] = zero_state(p);
    auto& exp_avg = states_[0];
    if (options_.weight_decay != 0) p.mul_(1 - hp.lr * options_.weight_decay);
    auto update = exp_avg.mul(hp.beta1).add_(grad, 1 - hp.beta1).sign_();
    p.add_(update, -hp.lr);
    exp_avg.mul_(hp.beta2).add_(grad, 1 - hp.beta2);
    ++steps_taken_;
  }
};

void require(bool ok, const std::string& field, double value, const std::string& expected) {
  if (ok) return;
  std::ostringstream msg;
  msg << "optimizer.params." << field << " = " << value << ": expected " << expected;
  throw ConfigError(msg.str());
}

}  // namespace

std::unique_ptr<FlatOptimizer> make_flat_optimizer(const OptimizerOptions& o) {
  require(std::isfinite(o.lr) && o.lr >= 0, "lr", o.lr, "a finite value >= 0");
  require(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "weight_decay", o.weight_decay, "a value >= 0");
  switch (o.kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      require(o.beta1 >= 0 && o.beta1 < 1, "betas[0]", o.beta1, "a value in [0, 1)");
      require(o.beta2 >= 0 && o.beta2 < 1, "betas[1]", o.beta2, "a value in [0, 1)");
      require(o.eps >= 0, "eps", o.eps, "a value >= 0");
      return std::make_unique<AdamOptimizer>(o);
    case OptimizerKind::SGD:
      require(o.momentum >= 0, "momentum", o.momentum, "a value >= 0");
      require(!o.nesterov || (o.momentum > 0 && o.dampening == 0), "dampening", o.dampening,
              "0 with momentum > 0 when nesterov is true");
      return std::make_unique<SgdOptimizer>(o);
    case OptimizerKind::Adagrad:
      require(o.lr_decay >= 0, "lr_decay", o.lr_decay, "a value >= 0");
      require(o.initial_accumulator_value >= 0, "initial_accumulator_value", o.initial_accumulator_value,
              "a value >= 0");
      require(o.eps >= 0, "eps", o.eps, "a value >= 0");
      return std::make_unique<AdagradOptimizer>(o);
    case OptimizerKind::Lion:
      require(o.beta1 >= 0 && o.beta1 <= 1, "betas[0]", o.beta1, "a value in [0, 1]");
      require(o.beta2 >= 0 && o.beta2 <= 1, "betas[1]", o.beta2, "a value in [0, 1]");
      return std::make_unique<LionOptimizer>(o);
  }
  throw ConfigError("optimizer.type: unknown optimizer kind");
}

}  // namespace tessera::optim
