// `tessera config new FILE`: asks Accelerate's DeepSpeed questions (ZeRO stage, offload, 16-bit save,
// accumulation, clipping, precision, machines) and writes a tessera TOML or DeepSpeed JSON file (by
// FILE's extension, or --format), so that nobody starts from a blank file.
//
//   $ tessera config new ds_config.json
//   Which ZeRO stage? [0] off, [1] optimizer states, [2] + gradients, [3] + parameters [2]: 3
//   ...
//   wrote ds_config.json; launch it with: tessera-launch --nproc-per-node 8 PROGRAM --config ds_config.json
//
// The answers become the DeepSpeed config Accelerate's plugin stands for, which is loaded and validated
// by the engine's own loader before anything is written (atomically: FILE.tmp, then rename; an existing
// FILE needs --force). Answers come from the terminal (a bad one is asked again) or from piped standard
// input, one line each (a bad one, or none left, is an error naming the question); --defaults takes
// every default without asking. The machines answers say how to launch; TOML keeps them as comments.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/config/load.h"
#include "core/config/write.h"
#include "core/error.h"
#include "tools/tessera/commands.h"

namespace tessera::cli {
namespace {

namespace cfg = tessera::config;

struct NewArgs {
  std::string file, format;
  bool defaults = false, force = false;
};

// One question at a time: the prompt on standard error, the answer from standard input.
class Questionnaire {
 public:
  explicit Questionnaire(bool defaults) : defaults_(defaults), interactive_(isatty(STDIN_FILENO) == 1) {}

  // The answer, checked by `parse` (which returns nullopt for an answer it refuses, with why in `error`).
  template <typename T>
  T ask(const std::string& question, const std::string& fallback,
        const std::function<std::optional<T>(const std::string&, std::string&)>& parse) {
    for (int attempt = 0;; ++attempt) {
      std::string answer = fallback;
      if (!defaults_) {
        std::cerr << question << " [" << fallback << "]: " << std::flush;
        std::string line;
        if (!std::getline(std::cin, line))
          throw ConfigError("config new: no answer to \"" + question + "\" (standard input ended; --defaults takes "
                            "every default)");
        if (const auto b = line.find_first_not_of(" \t"); b != std::string::npos)
          answer = line.substr(b, line.find_last_not_of(" \t\r") - b + 1);
        if (!interactive_) std::cerr << answer << "\n";
      }
      std::string error;
      if (auto value = parse(answer, error)) return *value;
      if (!interactive_ || defaults_ || attempt == 4)
        throw ConfigError("config new: \"" + question + "\": " + error + ", got \"" + answer + "\"");
      std::cerr << "  " << error << "\n";
    }
  }

  int integer(const std::string& q, int fallback, int low, int high) {
    return ask<int>(q, std::to_string(fallback), [&](const std::string& a, std::string& error) -> std::optional<int> {
      try {
        std::size_t used = 0;
        const int v = std::stoi(a, &used);
        if (used == a.size() && v >= low && v <= high) return v;
      } catch (const std::exception&) {
      }
      error = "expected an integer in " + std::to_string(low) + ".." + std::to_string(high);
      return std::nullopt;
    });
  }

  double number(const std::string& q, double fallback) {
    std::ostringstream f;
    f << fallback;
    return ask<double>(q, f.str(), [&](const std::string& a, std::string& error) -> std::optional<double> {
      try {
        std::size_t used = 0;
        const double v = std::stod(a, &used);
        if (used == a.size() && v >= 0) return v;
      } catch (const std::exception&) {
      }
      error = "expected a number >= 0";
      return std::nullopt;
    });
  }

  std::string choice(const std::string& q, const std::string& fallback, const std::vector<std::string>& choices) {
    return ask<std::string>(q, fallback, [&](const std::string& a, std::string& error) -> std::optional<std::string> {
      for (const auto& c : choices)
        if (a == c) return c;
      error = "expected one of";
      for (const auto& c : choices) error += " " + c;
      return std::nullopt;
    });
  }

  bool yes_no(const std::string& q, bool fallback) {
    return ask<bool>(q, fallback ? "yes" : "no", [](const std::string& a, std::string& error) -> std::optional<bool> {
      if (a == "yes" || a == "y" || a == "YES" || a == "Yes") return true;
      if (a == "no" || a == "n" || a == "NO" || a == "No") return false;
      error = "expected yes or no";
      return std::nullopt;
    });
  }

  std::string text(const std::string& q, const std::string& fallback) {
    return ask<std::string>(q, fallback, [](const std::string& a, std::string& error) -> std::optional<std::string> {
      if (!a.empty()) return a;
      error = "expected a value";
      return std::nullopt;
    });
  }

 private:
  bool defaults_, interactive_;
};

struct Machines {
  int count = 1, processes_per_machine = 1, port = 29500;
  std::string main_ip;
};

// The questions, in Accelerate's order, and the DeepSpeed config their answers stand for.
nlohmann::ordered_json ask_config(Questionnaire& q, Machines& machines) {
  machines.count = q.integer("How many machines will you use (more than 1 for multi-node training)?", 1, 1, 1 << 16);
  if (machines.count > 1) {
    machines.main_ip = q.text("What is the IP address of the machine that will host the main process?", "127.0.0.1");
    machines.port = q.integer("What is the port of the main process (tessera's store)?", 29500, 1, 65534);
  }
  machines.processes_per_machine = q.integer("How many processes (devices) per machine?", 1, 1, 1 << 16);
  nlohmann::ordered_json zero;
  const int stage = q.integer("Which ZeRO stage? [0] off, [1] optimizer states, [2] + gradients, [3] + parameters", 2, 0, 3);
  zero["stage"] = stage;
  auto offload = [&](const std::string& what, const std::string& key) {
    const std::string device = q.choice("Where should " + what + " live: none (the device), cpu or nvme?", "none",
                                        {"none", "cpu", "nvme"});
    if (device == "none") return;
    zero[key]["device"] = device;
    if (device == "nvme") zero[key]["nvme_path"] = q.text("Which NVMe directory for " + what + "?", "/local_nvme");
  };
  if (stage >= 1) offload("the optimizer states", "offload_optimizer");
  if (stage == 3) {
    offload("the parameters", "offload_param");
    zero["stage3_gather_16bit_weights_on_model_save"] =
        q.yes_no("Save the whole 16-bit model when saving (stage3_gather_16bit_weights_on_model_save)?", false);
  }
  nlohmann::ordered_json config;
  config["train_batch_size"] = "auto";
  config["train_micro_batch_size_per_gpu"] = "auto";
  config["gradient_accumulation_steps"] = q.integer("How many gradient accumulation steps?", 1, 1, 1 << 20);
  const double clipping = q.number("Clip gradients to which norm (0: no clipping)?", 1.0);
  if (clipping > 0) config["gradient_clipping"] = clipping;
  config["zero_optimization"] = zero;
  const std::string precision = q.choice("Which mixed precision: no, fp16 or bf16?", "no", {"no", "fp16", "bf16"});
  if (precision != "no") config[precision]["enabled"] = true;
  return config;
}

std::string launch_line(const Machines& m, const std::string& file) {
  std::string line = "tessera-launch --nproc-per-node " + std::to_string(m.processes_per_machine);
  if (m.count > 1)
    line += " --nnodes " + std::to_string(m.count) + " --node-rank <this machine, 0.." + std::to_string(m.count - 1) +
            "> --master-addr " + m.main_ip + " --master-port " + std::to_string(m.port);
  return line + " PROGRAM --config " + file;
}

void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw ConfigError("config new: cannot write " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw ConfigError("config new: cannot rename " + tmp + " to " + path);
  }
}

void run_new(const NewArgs& a) {
  const cfg::Format format = a.format.empty() ? cfg::format_of(a.file, "{") : (a.format == "toml" ? cfg::Format::toml
                                                                                                 : cfg::Format::json);
  if (!a.force && std::ifstream(a.file).good())
    throw ConfigError("config new: " + a.file + " exists (--force replaces it)");
  Questionnaire q(a.defaults);
  Machines machines;
  const auto document = ask_config(q, machines);
  // The engine's loader checks what the answers made before anything is written.
  const cfg::Config config = cfg::load_config_text(document.dump(), cfg::Format::json, "the answers");
  std::string text = cfg::to_text(config, format);
  const std::string launch = launch_line(machines, a.file);
  if (format == cfg::Format::toml)
    text = "# Written by `tessera config new`. Launch: " + launch + "\n" + text;
  write_atomically(a.file, text);
  std::cout << "wrote " << a.file << "; launch it with: " << launch << "\n";
  for (const auto& k : config.unsupported)
    std::cout << "note: " << k.path << " = " << k.value << " is not yet supported (" << k.why
              << "); the engine refuses it at start\n";
}

}  // namespace

void add_config_new_command(CLI::App& config) {
  auto args = std::make_shared<NewArgs>();
  CLI::App* cmd = config.add_subcommand("new", "Ask Accelerate's DeepSpeed questions and write a tessera TOML or "
                                               "DeepSpeed JSON file");
  cmd->add_option("FILE", args->file, "The file to write (.toml or .json)")->required();
  cmd->add_option("--format", args->format, "toml | json (default: from FILE's extension, else json)")
      ->check(CLI::IsMember({"toml", "json"}));
  cmd->add_flag("--defaults", args->defaults, "Take every default without asking");
  cmd->add_flag("--force", args->force, "Replace FILE if it exists");
  cmd->callback([args] { run_new(*args); });
}

}  // namespace tessera::cli
