// `tessera doctor`: versions of every dependency, then one live pass/fail line per check.
#include <CLI/CLI.hpp>

#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "core/version.h"
#include "tools/tessera/commands.h"
#include "tools/tessera/doctor/checks.h"
#include "transport/ucx/ucx_context.h"
#include "transport/nccl/nccl_info.h"
#include "transport/self_test.h"

namespace tessera::cli {

namespace {

struct Check {
  std::string name;
  std::function<std::string()> run;
};

int run_doctor() {
  // First, before anything starts threads: the self test forks its worker processes.
  const auto multiprocess = transport::run_transport_self_test({});
  std::cout << "tessera " << TESSERA_VERSION_STRING << "\n"
            << "  LibTorch  " << doctor::libtorch_version() << "\n"
            << "  CAF       " << doctor::caf_version() << "\n"
            << "  UCX       " << transport::ucx_version() << "\n"
            << "  toml++    " << doctor::toml_version() << "\n"
            << "  NCCL      " << transport::nccl_version() << "\n";
  std::string blas;
  try {
    blas = doctor::blas_in_use();
  } catch (const std::exception& e) {
    blas = std::string("unknown (") + e.what() + ")";
  }
  std::cout << "  BLAS      " << blas << "\n\n";

  const std::vector<Check> checks = {
      {"libtorch autograd", doctor::check_libtorch_autograd},
      {"caf request/response", doctor::check_caf_request_response},
      {"ucx context/worker", doctor::check_ucx},
      {"toml parse", doctor::check_toml},
      {"json parse", doctor::check_json},
      {"multi-process (2 ranks)", [&] {
         std::string joined;
         for (const auto& line : multiprocess.lines) joined += (joined.empty() ? "" : "; ") + line;
         if (!multiprocess.ok) throw std::runtime_error(joined);
         return joined;
       }},
  };
  int failed = 0;
  for (const auto& check : checks) {
    try {
      std::string detail = check.run();
      std::cout << "PASS  " << check.name << ": " << detail << "\n";
    } catch (const std::exception& e) {
      ++failed;
      std::cout << "FAIL  " << check.name << ": " << e.what() << "\n";
    }
  }
  std::cout << "\n" << (checks.size() - failed) << " passed, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}

}  // namespace

void add_doctor_command(CLI::App& app) {
  auto* doctor = app.add_subcommand("doctor", "Print dependency versions and check each one live");
  doctor->callback([] {
    if (int code = run_doctor(); code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace tessera::cli
