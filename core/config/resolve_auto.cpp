#include "core/config/resolve_auto.h"

#include <algorithm>
#include <sstream>

#include "core/config/detail/errors.h"
#include "core/config/validate.h"
#include "core/error.h"

namespace tessera::config {
namespace {

constexpr const char* kWorld = "the world size (--world-size)";
constexpr const char* kHidden = "the model's hidden size (--hidden-size)";
constexpr const char* kMicro = "the per-device batch size (--micro-batch)";

std::string num(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

class Resolver {
 public:
  Resolver(const Config& config, const Facts& facts, bool strict)
      : c_(config), facts_(facts), strict_(strict), errors_(config.source.empty() ? "<string>" : config.source) {}

  Config run() {
    ZeroConfig& z = c_.zero_optimization;
    fill(z.stage, "zero_optimization.stage", facts_.zero_stage);
    if (!z.stage.is_auto && z.stage.value == 3 && c_.provenance.get("zero_optimization.overlap_comm").origin == Origin::default_value) {
      z.overlap_comm = true;  // DeepSpeed's default with stage 3, now that the stage is known
      c_.provenance.set("zero_optimization.overlap_comm", Origin::default_value, "true with stage 3");
    }
    fill(z.offload_optimizer.device, "zero_optimization.offload_optimizer.device", facts_.offload_optimizer_device);
    fill(z.offload_param.device, "zero_optimization.offload_param.device", facts_.offload_param_device);
    nvme_path(z.offload_optimizer.nvme_path, "zero_optimization.offload_optimizer.nvme_path", facts_.offload_optimizer_nvme_path);
    nvme_path(z.offload_param.nvme_path, "zero_optimization.offload_param.nvme_path", facts_.offload_param_nvme_path);
    // Decided by the save call when no fact gives it: pending, never an error (a file that works
    // with DeepSpeed must not fail for a fact only a later call supplies).
    fill(z.stage3_gather_16bit_weights_on_model_save, "zero_optimization.stage3_gather_16bit_weights_on_model_save",
         facts_.save_16bit_model, /*decided_later=*/true);
    precision();
    fill(c_.gradient_clipping, "gradient_clipping", facts_.gradient_clipping);
    if (c_.optimizer) {
      OptimizerConfig& o = *c_.optimizer;
      fill(o.lr, "optimizer.params.lr", facts_.lr);
      fill(o.weight_decay, "optimizer.params.weight_decay", facts_.weight_decay);
      fill(o.betas, "optimizer.params.betas", facts_.betas);
      fill(o.eps, "optimizer.params.eps", facts_.eps);
    }
    if (c_.scheduler) scheduler(*c_.scheduler);
    hidden_size_rules();
    batch();
    errors_.raise_if_any();  // without strict_, only contradictions reach the list
    validate(c_);
    return std::move(c_);
  }

 private:
  template <class T, class F>
  void fill(Auto<T>& value, const std::string& path, const std::optional<F>& fact, bool decided_later = false) {
    if (!value.is_auto) return;
    if (fact) {
      value = Auto<T>(static_cast<T>(*fact));
      c_.provenance.set(path, Origin::derived, "from " + fact_for(path));
    } else if (decided_later) {
      c_.provenance.set(path, Origin::pending_auto, fact_for(path), c_.provenance.get(path).line);
    } else {
      missing(path, fact_for(path));
    }
  }

  void nvme_path(std::string& value, const std::string& path, const std::optional<std::string>& fact) {
    if (!value.empty() || !fact) return;
    value = *fact;
    c_.provenance.set(path, Origin::derived, "from the command line (--" + std::string(path.find("optimizer") != std::string::npos
                                                                                    ? "offload-optimizer-nvme-path"
                                                                                    : "offload-param-nvme-path") + ")");
  }

  // Records that `path` waits for `fact`; with strict_, that is an error. `is_auto` tells an
  // "auto" value from one the file left out, which is derived once the fact is known.
  void missing(const std::string& path, const std::string& fact, bool is_auto = true) {
    const int line = c_.provenance.get(path).line;
    c_.provenance.set(path, Origin::pending_auto, fact, line);
    if (strict_) {
      errors_.add(path, line, (is_auto ? "\"auto\" cannot be resolved: it needs " : "cannot be derived: it needs ") + fact);
    }
  }

  // fp16/bf16 "auto" follow the mixed precision mode. Like Accelerate, the mode also turns on a
  // precision whose section the file leaves out (fp16 then also casts inputs: auto_cast).
  void precision() {
    auto& fp16 = c_.fp16.enabled;
    auto& bf16 = c_.bf16.enabled;
    const bool fp16_absent = c_.provenance.get("fp16.enabled").origin == Origin::default_value;
    const bool bf16_absent = c_.provenance.get("bf16.enabled").origin == Origin::default_value;
    if (!facts_.mixed_precision) {
      if (fp16.is_auto) missing("fp16.enabled", fact_for("fp16.enabled"));
      if (bf16.is_auto) missing("bf16.enabled", fact_for("bf16.enabled"));
      return;
    }
    const std::string& mode = *facts_.mixed_precision;
    if (mode != "no" && mode != "fp16" && mode != "bf16") {
      errors_.add("fp16.enabled", 0, "the mixed precision mode must be no, fp16 or bf16, got \"" + mode + "\"");
      return;
    }
    const std::string note = "from the mixed precision mode " + mode;
    const bool fp16_given_on = !fp16_absent && !fp16.is_auto && fp16.value;
    const bool bf16_given_on = !bf16_absent && !bf16.is_auto && bf16.value;
    if (fp16.is_auto || (fp16_absent && mode == "fp16" && !bf16_given_on)) {
      fp16 = Auto<bool>(mode == "fp16");
      c_.provenance.set("fp16.enabled", Origin::derived, note);
      if (fp16_absent && mode == "fp16" && c_.provenance.get("fp16.auto_cast").origin == Origin::default_value) {
        c_.fp16.auto_cast = true;
        c_.provenance.set("fp16.auto_cast", Origin::derived, "true when fp16 comes from the mixed precision mode");
      }
    }
    if (bf16.is_auto || (bf16_absent && mode == "bf16" && !fp16_given_on)) {
      bf16 = Auto<bool>(mode == "bf16");
      c_.provenance.set("bf16.enabled", Origin::derived, note);
    }
  }

  void scheduler(SchedulerConfig& s) {
    const std::string p = "scheduler.params.";
    if (s.warmup_min_lr.is_auto) {
      s.warmup_min_lr = Auto<double>(0.0);
      c_.provenance.set(p + "warmup_min_lr", Origin::derived, "0 (Accelerate's rule for auto)");
    }
    if (s.warmup_max_lr.is_auto) {
      std::optional<double> lr = facts_.lr;
      if (!lr && c_.optimizer && !c_.optimizer->lr.is_auto) lr = c_.optimizer->lr.value;
      if (lr) {
        s.warmup_max_lr = Auto<double>(*lr);
        c_.provenance.set(p + "warmup_max_lr", Origin::derived, "the learning rate " + num(*lr));
      } else {
        missing(p + "warmup_max_lr", fact_for(p + "warmup_max_lr"));
      }
    }
    fill(s.warmup_num_steps, p + "warmup_num_steps", facts_.warmup_steps);
    fill(s.total_num_steps, p + "total_num_steps", facts_.total_steps);
  }

  void hidden_size_rules() {
    ZeroConfig& z = c_.zero_optimization;
    const std::string p = "zero_optimization.";
    struct Rule { Auto<std::int64_t>* value; const char* key; };
    for (const Rule& rule : {Rule{&z.reduce_bucket_size, "reduce_bucket_size"},
                             Rule{&z.stage3_prefetch_bucket_size, "stage3_prefetch_bucket_size"},
                             Rule{&z.stage3_param_persistence_threshold, "stage3_param_persistence_threshold"}}) {
      if (!rule.value->is_auto) continue;
      if (!facts_.hidden_size) {
        missing(p + rule.key, kHidden);
        continue;
      }
      const std::int64_t h = *facts_.hidden_size;
      if (h < 1 || h > 3'000'000'000) {
        errors_.add(p + rule.key, 0, "the hidden size fact must be a positive size, got " + std::to_string(h));
        continue;
      }
      const std::string k = rule.key;
      std::int64_t v = 0;
      std::string note;
      if (k == "reduce_bucket_size") {
        v = h * h, note = "hidden size " + std::to_string(h) + " squared";
      } else if (k == "stage3_prefetch_bucket_size") {
        // int(0.9 * h * h) as Accelerate computes it, in doubles, truncated.
        v = static_cast<std::int64_t>(0.9 * static_cast<double>(h) * static_cast<double>(h));
        note = "int(0.9 x " + std::to_string(h) + " x " + std::to_string(h) + ")";
      } else {
        v = 10 * h, note = "10 x hidden size " + std::to_string(h);
      }
      *rule.value = Auto<std::int64_t>(v);
      c_.provenance.set(p + k, Origin::derived, note);
    }
  }

  // train_batch_size = micro x accumulation x dp (module comment in resolve_auto.h).
  void batch() {
    auto& T = c_.train_batch_size;
    auto& m = c_.train_micro_batch_size_per_gpu;
    auto& g = c_.gradient_accumulation_steps;
    const char* kT = "train_batch_size";
    const char* kM = "train_micro_batch_size_per_gpu";
    const char* kG = "gradient_accumulation_steps";
    auto known = [](const Auto<std::int64_t>& v) { return !v.is_auto && v.value > 0; };
    auto absent = [](const Auto<std::int64_t>& v) { return !v.is_auto && v.value == 0; };
    auto set = [&](Auto<std::int64_t>& v, const char* key, std::int64_t value, const std::string& note) {
      v = Auto<std::int64_t>(value);
      c_.provenance.set(key, Origin::derived, note);
    };
    if (m.is_auto && facts_.micro_batch_size) set(m, kM, *facts_.micro_batch_size, "from " + std::string(kMicro));
    if (g.is_auto && facts_.gradient_accumulation_steps) {
      set(g, kG, *facts_.gradient_accumulation_steps, "from " + fact_for(kG));
    }
    if (absent(T) && absent(m) && facts_.micro_batch_size) set(m, kM, *facts_.micro_batch_size, "from " + std::string(kMicro));

    if (!facts_.world_size) {
      // Nothing can be derived or checked without the data-parallel size.
      if (!known(T)) missing(kT, kWorld, T.is_auto);
      if (!known(m)) missing(kM, m.is_auto || absent(T) ? kMicro : kWorld, m.is_auto);
      if (!known(g) && g.is_auto) missing(kG, fact_for(kG));
      return;
    }
    // autotp_size 0 is DeepSpeed's "disabled", as 1 is.
    const std::int64_t world = *facts_.world_size, tp = std::max<std::int64_t>(1, c_.tensor_parallel.autotp_size);
    if (world < 1 || tp < 1 || world % tp != 0) {
      errors_.add("tensor_parallel.autotp_size", 0, "the world size " + std::to_string(world) +
                                                        " is not a multiple of autotp_size " + std::to_string(tp));
      return;
    }
    const std::int64_t dp = world / tp;
    const std::string dp_words = "data-parallel size " + std::to_string(dp) +
                                 (tp > 1 ? " (world size " + std::to_string(world) + " / autotp_size " + std::to_string(tp) + ")" : "");
    if (known(T) && known(m) && known(g)) {
      if (T.value != m.value * g.value * dp) {
        errors_.add(kT, c_.provenance.get(kT).line,
                    std::to_string(T.value) + " does not equal train_micro_batch_size_per_gpu x gradient_accumulation_steps x " +
                        "data-parallel size = " + std::to_string(m.value) + " x " + std::to_string(g.value) + " x " +
                        std::to_string(dp) + " = " + std::to_string(m.value * g.value * dp));
      }
      return;
    }
    auto divide = [&](const char* key, Auto<std::int64_t>& out, std::int64_t numerator, std::int64_t denominator,
                      const std::string& words) {
      if (numerator % denominator != 0) {
        errors_.add(key, 0, "cannot be derived: train_batch_size " + std::to_string(numerator) + " is not divisible by " +
                                words + " = " + std::to_string(denominator));
        return;
      }
      set(out, key, numerator / denominator, std::to_string(numerator) + " / " + std::to_string(denominator) + " (" + words + ")");
    };
    if (known(T) && known(m)) {
      divide(kG, g, T.value, m.value * dp, "micro batch x " + dp_words);
    } else if (known(T) && known(g)) {
      divide(kM, m, T.value, g.value * dp, "accumulation x " + dp_words);
    } else if (known(m) && known(g)) {
      set(T, kT, m.value * g.value * dp, std::to_string(m.value) + " x " + std::to_string(g.value) + " x " + std::to_string(dp) +
                                              " (micro x accumulation x " + dp_words + ")");
    } else if (known(T) && absent(g)) {
      set(g, kG, 1, "1 (DeepSpeed's default when only train_batch_size is given)");
      divide(kM, m, T.value, dp, dp_words);
    } else if (known(m) && absent(g)) {
      set(g, kG, 1, "1 (DeepSpeed's default when only train_micro_batch_size_per_gpu is given)");
      set(T, kT, m.value * dp, std::to_string(m.value) + " x 1 x " + std::to_string(dp) + " (micro x accumulation x " + dp_words + ")");
    } else {
      // Two of the three are unknown: the per-device batch size (or the accumulation steps) must come as facts.
      if (g.is_auto && !known(g)) missing(kG, fact_for(kG));
      if (!known(m)) missing(kM, kMicro, m.is_auto);
      if (!known(T)) missing(kT, kMicro, T.is_auto);
    }
  }

  Config c_;
  const Facts& facts_;
  bool strict_;
  detail::ErrorList errors_;
};

}  // namespace

std::string fact_for(const std::string& path) {
  static const std::pair<const char*, const char*> kFacts[] = {
      {"train_batch_size", "the world size (--world-size) and the per-device batch size (--micro-batch)"},
      {"train_micro_batch_size_per_gpu", kMicro},
      {"gradient_accumulation_steps", "the gradient accumulation steps (--grad-accum)"},
      {"gradient_clipping", "the gradient clipping norm (--grad-clip)"},
      {"fp16.enabled", "the mixed precision mode (--mixed-precision no|fp16|bf16)"},
      {"bf16.enabled", "the mixed precision mode (--mixed-precision no|fp16|bf16)"},
      {"optimizer.params.lr", "the learning rate (--lr)"},
      {"optimizer.params.weight_decay", "the weight decay (--weight-decay)"},
      {"optimizer.params.betas", "the Adam betas (--betas B1,B2)"},
      {"optimizer.params.eps", "the Adam epsilon (--eps)"},
      {"scheduler.params.warmup_min_lr", "nothing (auto is 0)"},
      {"scheduler.params.warmup_max_lr", "the learning rate (--lr)"},
      {"scheduler.params.warmup_num_steps", "the warmup steps (--warmup-steps)"},
      {"scheduler.params.total_num_steps", "the total training steps (--total-steps)"},
      {"zero_optimization.stage", "the ZeRO stage (--zero-stage)"},
      {"zero_optimization.offload_optimizer.device", "the optimizer offload device (--offload-optimizer none|cpu|nvme)"},
      {"zero_optimization.offload_param.device", "the parameter offload device (--offload-param none|cpu|nvme)"},
      {"zero_optimization.stage3_gather_16bit_weights_on_model_save",
       "the save call, which decides whether to gather 16-bit weights (or --save-16bit-model)"},
      {"zero_optimization.reduce_bucket_size", kHidden},
      {"zero_optimization.stage3_prefetch_bucket_size", kHidden},
      {"zero_optimization.stage3_param_persistence_threshold", kHidden},
  };
  for (const auto& [p, fact] : kFacts) {
    if (path == p) return fact;
  }
  return {};
}

Config resolve_auto(const Config& config, const Facts& facts) { return Resolver(config, facts, true).run(); }

Config resolve_for_engine(const Config& config, const Facts& facts) {
  Config resolved = resolve_auto(config, facts);
  refuse_unsupported(resolved);
  return resolved;
}

Config resolve_known(const Config& config, const Facts& facts) { return Resolver(config, facts, false).run(); }

std::vector<std::pair<std::string, std::string>> pending_auto(const Config& config) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [path, mark] : config.provenance.all()) {
    if (mark.origin == Origin::pending_auto) out.emplace_back(path, mark.note);
  }
  return out;
}

}  // namespace tessera::config
