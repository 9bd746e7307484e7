// OptimizerOptions: which optimizer updates a partition, and its hyperparameters, with
// DeepSpeed's names and defaults (the engine fills it from the `optimizer` config section).
//
// Kinds and the update each applies (all follow LibTorch's torch::optim operation for operation,
// so a partitioned run equals an unpartitioned LibTorch run bit for bit):
//   Adam     L2 weight decay folded into the gradient (torch::optim::Adam)
//   AdamW    decoupled weight decay p *= 1 - lr*wd   (torch::optim::AdamW; DeepSpeed "Adam" with
//            adam_w_mode=true, its default, is this one)
//   SGD      momentum, dampening, nesterov, weight decay (torch::optim::SGD)
//   Adagrad  lr_decay, initial_accumulator_value, eps (torch::optim::Adagrad)
//   Lion     sign update with decoupled weight decay (Chen et al. 2023; DeepSpeed's Lion)
#pragma once

#include <string>

namespace tessera::optim {

enum class OptimizerKind { Adam, AdamW, SGD, Adagrad, Lion };

struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::AdamW;
  double lr = 1e-3;
  double beta1 = 0.9;    // Adam/AdamW/Lion
  double beta2 = 0.999;  // Adam/AdamW (Lion's default is 0.99)
  double eps = 1e-8;     // Adam/AdamW; Adagrad uses 1e-10 by default
  double weight_decay = 0.0;
  bool amsgrad = false;  // Adam/AdamW
  double momentum = 0.0;   // SGD
  double dampening = 0.0;  // SGD
  bool nesterov = false;   // SGD
  double lr_decay = 0.0;   // Adagrad
  double initial_accumulator_value = 0.0;  // Adagrad
  // Keep the per-element states in bf16 (DeepSpeed's bf16.bf16_optimizer_states); the update
  // itself still runs in the parameter's dtype.
  bool bf16_states = false;
};

// "Adam", "AdamW", "SGD", "Adagrad", "Lion" (DeepSpeed's `optimizer.type`, case-insensitive).
OptimizerKind parse_optimizer_kind(const std::string& name);
std::string to_string(OptimizerKind kind);

// The defaults LibTorch / DeepSpeed use for a kind (e.g. Lion: lr 1e-4, betas (0.9, 0.99)).
OptimizerOptions default_options(OptimizerKind kind);

}  // namespace tessera::optim
