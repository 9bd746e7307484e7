// `tessera config check|convert`: validate, explain and convert tessera TOML / DeepSpeed JSON.
//
//   tessera config check zero3.toml --world-size 8 --hidden-size 4096 --micro-batch 2 --lr 1e-5
// prints every value with its provenance (given / default / derived / auto waiting for a fact),
// the keys accepted and ignored, and the keys not yet supported (those are refused only when an
// engine starts). Exit status 0 for a valid file, 1 with the errors otherwise (ConfigError is
// printed by main.cpp). --strict also requires every auto value to be resolved by the facts.
//
//   tessera config convert ds_config.json --to toml [-o out.toml] [--include-defaults]
// writes the configuration in the other syntax; reading the result back gives an equal config.
#include <CLI/CLI.hpp>

#include <array>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/config/describe.h"
#include "core/config/load.h"
#include "core/config/resolve_auto.h"
#include "core/config/write.h"
#include "core/error.h"
#include "tools/tessera/commands.h"

namespace tessera::cli {
namespace {

namespace cfg = tessera::config;

struct CheckArgs {
  std::string file;
  std::int64_t world_size = 0, hidden_size = 0, micro_batch = 0, grad_accum = 0, warmup_steps = 0, total_steps = 0,
               zero_stage = 0;
  double lr = 0, weight_decay = 0, eps = 0, grad_clip = 0;
  std::vector<double> betas;
  std::string mixed_precision, offload_optimizer, offload_param, offload_optimizer_nvme_path, offload_param_nvme_path;
  bool save_16bit_model = false;
  bool strict = false;
  std::map<std::string, CLI::Option*> given;
};

struct ConvertArgs {
  std::string file, to, output;
  bool include_defaults = false;
};

cfg::OffloadDevice parse_device(const std::string& flag, const std::string& value) {
  if (value == "none") return cfg::OffloadDevice::none;
  if (value == "cpu") return cfg::OffloadDevice::cpu;
  if (value == "nvme") return cfg::OffloadDevice::nvme;
  throw ConfigError(flag + ": expected none, cpu or nvme, got \"" + value + "\"");
}

cfg::Facts facts_from(const CheckArgs& a) {
  cfg::Facts f;
  auto has = [&](const char* flag) { return a.given.at(flag)->count() > 0; };
  if (has("--world-size")) f.world_size = a.world_size;
  if (has("--hidden-size")) f.hidden_size = a.hidden_size;
  if (has("--micro-batch")) f.micro_batch_size = a.micro_batch;
  if (has("--grad-accum")) f.gradient_accumulation_steps = a.grad_accum;
  if (has("--lr")) f.lr = a.lr;
  if (has("--weight-decay")) f.weight_decay = a.weight_decay;
  if (has("--betas")) f.betas = std::array<double, 2>{a.betas.at(0), a.betas.at(1)};
  if (has("--eps")) f.eps = a.eps;
  if (has("--grad-clip")) f.gradient_clipping = a.grad_clip;
  if (has("--warmup-steps")) f.warmup_steps = a.warmup_steps;
  if (has("--total-steps")) f.total_steps = a.total_steps;
  if (has("--mixed-precision")) f.mixed_precision = a.mixed_precision;
  if (has("--zero-stage")) f.zero_stage = a.zero_stage;
  if (has("--offload-optimizer")) f.offload_optimizer_device = parse_device("--offload-optimizer", a.offload_optimizer);
  if (has("--offload-param")) f.offload_param_device = parse_device("--offload-param", a.offload_param);
  if (has("--save-16bit-model")) f.save_16bit_model = a.save_16bit_model;
  if (has("--offload-optimizer-nvme-path")) f.offload_optimizer_nvme_path = a.offload_optimizer_nvme_path;
  if (has("--offload-param-nvme-path")) f.offload_param_nvme_path = a.offload_param_nvme_path;
  return f;
}

void run_check(const CheckArgs& a) {
  const cfg::Config loaded = cfg::load_config(a.file);
  const cfg::Facts facts = facts_from(a);
  const cfg::Config config = a.strict ? cfg::resolve_auto(loaded, facts) : cfg::resolve_known(loaded, facts);
  std::cout << "# " << a.file << ": valid "
            << (cfg::format_of(a.file) == cfg::Format::toml ? "tessera TOML" : "DeepSpeed JSON") << " configuration\n";
  std::cout << cfg::describe(config);
  if (!config.warnings.empty()) {
    std::cout << "\nwarnings (" << config.warnings.size() << "):\n";
    for (const std::string& w : config.warnings) std::cout << "  warning: " << w << "\n";
  }
  if (!config.unsupported.empty()) {
    std::cout << "\nnot yet supported, refused when the engine starts (" << config.unsupported.size() << "):\n";
    for (const cfg::UnsupportedKey& k : config.unsupported) {
      std::cout << "  " << k.path << " = " << k.value << ": not yet supported (" << k.why << ")\n";
    }
  }
  const auto pending = cfg::pending_auto(config);
  if (!pending.empty()) {
    std::cout << "\nauto values resolved when the engine starts (" << pending.size() << "):\n";
    for (const auto& [path, fact] : pending) std::cout << "  " << path << ": waits for " << fact << "\n";
  }
}

void run_convert(const ConvertArgs& a) {
  const cfg::Config config = cfg::load_config(a.file);
  for (const std::string& w : config.warnings) std::cerr << "warning: " << w << "\n";
  cfg::WriteOptions options;
  options.include_defaults = a.include_defaults;
  const std::string text = cfg::to_text(config, a.to == "toml" ? cfg::Format::toml : cfg::Format::json, options);
  if (a.output.empty()) {
    std::cout << text;
    return;
  }
  std::ofstream out(a.output, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (!out) {
    std::cerr << "tessera: error: cannot write " << a.output << "\n";
    throw CLI::RuntimeError(1);
  }
}

}  // namespace

void add_config_commands(CLI::App& app) {
  CLI::App* config = app.add_subcommand("config", "Validate, convert and write tessera TOML / DeepSpeed JSON configurations");
  config->require_subcommand(1);

  auto check_args = std::make_shared<CheckArgs>();
  CLI::App* check = config->add_subcommand(
      "check", "Validate a configuration and print every value as given, default, derived or auto (with the fact it waits for)");
  check->add_option("FILE", check_args->file, "A tessera .toml or DeepSpeed .json file")->required();
  auto& g = check_args->given;
  g["--world-size"] = check->add_option("--world-size", check_args->world_size, "Number of ranks")->check(CLI::PositiveNumber);
  g["--hidden-size"] = check->add_option("--hidden-size", check_args->hidden_size, "The model's hidden size h")->check(CLI::PositiveNumber);
  g["--micro-batch"] = check->add_option("--micro-batch", check_args->micro_batch, "Per-device batch size")->check(CLI::PositiveNumber);
  g["--grad-accum"] = check->add_option("--grad-accum", check_args->grad_accum, "Gradient accumulation steps")->check(CLI::PositiveNumber);
  g["--lr"] = check->add_option("--lr", check_args->lr, "Learning rate");
  g["--weight-decay"] = check->add_option("--weight-decay", check_args->weight_decay, "Weight decay");
  g["--betas"] = check->add_option("--betas", check_args->betas, "Adam betas: B1,B2")->expected(2)->delimiter(',');
  g["--eps"] = check->add_option("--eps", check_args->eps, "Adam epsilon");
  g["--grad-clip"] = check->add_option("--grad-clip", check_args->grad_clip, "Gradient clipping norm");
  g["--warmup-steps"] = check->add_option("--warmup-steps", check_args->warmup_steps, "LR warmup steps");
  g["--total-steps"] = check->add_option("--total-steps", check_args->total_steps, "Total training steps");
  g["--mixed-precision"] = check->add_option("--mixed-precision", check_args->mixed_precision, "no | fp16 | bf16")
                               ->check(CLI::IsMember({"no", "fp16", "bf16"}));
  g["--zero-stage"] = check->add_option("--zero-stage", check_args->zero_stage, "ZeRO stage")->check(CLI::Range(0, 3));
  g["--offload-optimizer"] = check->add_option("--offload-optimizer", check_args->offload_optimizer, "none | cpu | nvme")
                                 ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  g["--offload-param"] = check->add_option("--offload-param", check_args->offload_param, "none | cpu | nvme")
                             ->check(CLI::IsMember({"none", "cpu", "nvme"}));
  g["--offload-optimizer-nvme-path"] = check->add_option("--offload-optimizer-nvme-path",
                                                         check_args->offload_optimizer_nvme_path, "NVMe folder for optimizer states");
  g["--offload-param-nvme-path"] = check->add_option("--offload-param-nvme-path", check_args->offload_param_nvme_path,
                                                     "NVMe folder for parameters");
  g["--save-16bit-model"] = check->add_option("--save-16bit-model", check_args->save_16bit_model, "true | false");
  check->add_flag("--strict", check_args->strict, "Also fail when an auto value cannot be resolved from the facts given");
  check->callback([check_args] { run_check(*check_args); });

  auto convert_args = std::make_shared<ConvertArgs>();
  CLI::App* convert = config->add_subcommand("convert", "Write a configuration as tessera TOML or DeepSpeed JSON");
  convert->add_option("FILE", convert_args->file, "A tessera .toml or DeepSpeed .json file")->required();
  convert->add_option("--to", convert_args->to, "Output syntax: toml | json")
      ->required()
      ->check(CLI::IsMember({"toml", "json"}));
  convert->add_option("-o,--output", convert_args->output, "Write here instead of standard output");
  convert->add_flag("--include-defaults", convert_args->include_defaults,
                    "Also write the values that are DeepSpeed's defaults (by default only what differs or was written)");
  convert->callback([convert_args] { run_convert(*convert_args); });
  add_config_new_command(*config);
}

}  // namespace tessera::cli
