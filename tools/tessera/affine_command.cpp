// `tessera affine plan|check`: plan transfers between affine maps, validate maps (core/affine, issue 3).
//
//   tessera affine plan --target T.json --source S.json [--policy lowest|balanced] [--format tessera|deepspeed]
//     Reads two map documents (tessera map or map set, DeepSpeed map or {"params": ...} document),
//     pairs tensors by name (or the two single maps), plans them as one batch and prints the plans
//     with their statistics on stdout. --format deepspeed prints DeepSpeed TransferPlan dicts and a
//     statistics line on stderr.
//   tessera affine check MAP.json
//     Validates every map of the document and prints its pieces per rank; exit status 1 if any map
//     is invalid (each error names tensor, rank and box).
#include <CLI/CLI.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "core/affine/deepspeed_format.h"
#include "core/affine/errors.h"
#include "core/affine/planner.h"
#include "core/affine/serialize.h"
#include "core/affine/validate.h"
#include "tools/tessera/commands.h"

namespace tessera::cli {
namespace {

namespace af = tessera::affine;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw af::FormatError("cannot read map file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<af::TensorMap> read_maps(const std::string& path) {
  try {
    return af::read_maps_any_format(read_file(path));
  } catch (const af::FormatError& e) {
    throw af::FormatError(path + ": " + e.what());
  }
}

struct PlanArgs {
  std::string target, source, policy = "lowest", format = "tessera";
};

std::string statistics_line(const af::Plan& plan) {
  const auto& st = plan.statistics;
  std::ostringstream os;
  os << "{\"tensor\":\"" << plan.name << "\",\"policy\":\"" << plan.policy << "\",\"source_pieces\":" << st.source_pieces
     << ",\"target_pieces\":" << st.target_pieces << ",\"segments\":" << st.segments
     << ",\"moved_bytes\":" << st.moved_bytes << ",\"bytes_per_source_rank\":{";
  bool first = true;
  for (const auto& [rank, bytes] : st.bytes_per_source_rank) {
    os << (first ? "" : ",") << "\"" << rank << "\":" << bytes;
    first = false;
  }
  os << "},\"input_digest\":\"" << af::hex_digest(plan.input_digest) << "\"}";
  return os.str();
}

void run_plan(const PlanArgs& args) {
  const auto targets = read_maps(args.target);
  const auto sources = read_maps(args.source);
  std::vector<af::PlanRequest> requests;
  if (targets.size() == 1 && sources.size() == 1) {
    requests.push_back({&targets[0], &sources[0]});
  } else {
    std::map<std::string, const af::TensorMap*> by_name;
    for (const auto& s : sources) by_name[s.name] = &s;
    for (const auto& t : targets) {
      auto it = by_name.find(t.name);
      if (it == by_name.end()) {
        throw af::InvalidMapError("tensor '" + t.name + "' of " + args.target + " has no source map in " + args.source);
      }
      requests.push_back({&t, it->second});
    }
  }
  af::PlanOptions options;
  options.policy = af::parse_replica_policy(args.policy);
  const auto plans = af::plan_batch(requests, options);
  if (args.format == "deepspeed") {
    if (plans.size() == 1) {
      std::cout << af::plan_to_deepspeed_json(plans[0], 2) << "\n";
    } else {
      std::cout << "{\"plans\": {";
      for (size_t i = 0; i < plans.size(); ++i) {
        std::cout << (i ? ", " : "") << "\"" << plans[i].name << "\": " << af::plan_to_deepspeed_json(plans[i]);
      }
      std::cout << "}}\n";
    }
    for (const auto& p : plans) std::cerr << statistics_line(p) << "\n";
  } else {
    std::cout << (plans.size() == 1 ? af::plan_to_json(plans[0], 2) : af::plans_to_json(plans, 2)) << "\n";
  }
}

void run_check(const std::string& path) {
  const auto maps = read_maps(path);
  int invalid = 0;
  for (const auto& map : maps) {
    try {
      const af::MapSummary summary = af::validate_map(map);
      std::cout << "tensor '" << map.name << "' " << af::dtype_name(map.dtype) << " " << af::to_string(map.shape) << ": "
                << summary.nonempty_pieces << " pieces, " << summary.regions << " regions, covers "
                << summary.covered_elements << " elements: ok\n";
      for (const auto& [rank, pieces] : summary.pieces_per_rank) {
        std::cout << "  rank " << rank << ": " << pieces << " pieces, " << summary.elements_per_rank.at(rank)
                  << " elements, buffer " << map.ranks.at(rank).buffer_elements << " elements\n";
      }
    } catch (const tessera::MapError& e) {
      ++invalid;
      std::cout << "tensor '" << map.name << "': INVALID\n";
      std::cerr << "tessera affine check: " << e.what() << "\n";
    }
  }
  std::cout << maps.size() - static_cast<size_t>(invalid) << " of " << maps.size() << " maps valid\n";
  if (invalid) throw CLI::RuntimeError(1);
}

}  // namespace

void add_affine_commands(CLI::App& app) {
  auto* affine = app.add_subcommand("affine", "Plan transfers between affine maps and check maps");
  affine->require_subcommand(1);

  auto args = std::make_shared<PlanArgs>();
  auto* plan = affine->add_subcommand("plan", "Plan the transfer of every tensor from a source to a target map");
  plan->add_option("--target", args->target, "target map document (tessera or DeepSpeed JSON)")->required();
  plan->add_option("--source", args->source, "source map document (tessera or DeepSpeed JSON)")->required();
  plan->add_option("--policy", args->policy, "replica policy")->check(CLI::IsMember({"lowest", "balanced"}));
  plan->add_option("--format", args->format, "output format")->check(CLI::IsMember({"tessera", "deepspeed"}));
  plan->callback([args] { run_plan(*args); });

  auto path = std::make_shared<std::string>();
  auto* check = affine->add_subcommand("check", "Validate a map document and print its pieces per rank");
  check->add_option("map", *path, "map document (tessera or DeepSpeed JSON)")->required();
  check->callback([path] { run_check(*path); });
}

}  // namespace tessera::cli
