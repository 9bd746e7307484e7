#include "core/optim/optimizer_options.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"

namespace tessera::optim {

OptimizerKind parse_optimizer_kind(const std::string& name) {
  std::string lower = name;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "adam") return OptimizerKind::Adam;
  if (lower == "adamw") return OptimizerKind::AdamW;
  if (lower == "sgd") return OptimizerKind::SGD;
  if (lower == "adagrad") return OptimizerKind::Adagrad;
  if (lower == "lion") return OptimizerKind::Lion;
  throw ConfigError("optimizer.type = \"" + name + "\": expected one of Adam, AdamW, SGD, Adagrad, Lion");
}

std::string to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Adam: return "Adam";
    case OptimizerKind::AdamW: return "AdamW";
    case OptimizerKind::SGD: return "SGD";
    case OptimizerKind::Adagrad: return "Adagrad";
    case OptimizerKind::Lion: return "Lion";
  }
  return "unknown";
}

OptimizerOptions default_options(OptimizerKind kind) {
  OptimizerOptions o;
  o.kind = kind;
  switch (kind) {
    case OptimizerKind::Adam:
    case OptimizerKind::AdamW:
      o.lr = 1e-3;
      o.weight_decay = kind == OptimizerKind::AdamW ? 1e-2 : 0.0;  // torch::optim's defaults
      break;
    case OptimizerKind::SGD:
      o.lr = 1e-3;
      break;
    case OptimizerKind::Adagrad:
      o.lr = 1e-2;
      o.eps = 1e-10;
      break;
    case OptimizerKind::Lion:
      o.lr = 1e-4;
      o.beta1 = 0.9;
      o.beta2 = 0.99;
      break;
  }
  return o;
}

}  // namespace tessera::optim
