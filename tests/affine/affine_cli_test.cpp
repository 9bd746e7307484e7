// `tessera affine plan|check` run as processes: exit codes and output. The binary path comes from
// the build (TESSERA_BINARY = $<TARGET_FILE:tessera>); map files are written to the build folder.
#include <catch2/catch.hpp>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/affine/builders.h"
#include "core/affine/deepspeed_format.h"
#include "core/affine/planner.h"
#include "core/affine/serialize.h"

using namespace tessera::affine;
namespace affine = tessera::affine;

namespace {

struct Result {
  int status = -1;
  std::string out;  // stdout and stderr together
};

Result run(const std::string& args) {
  const std::string command = std::string(TESSERA_BINARY) + " " + args + " 2>&1";
  Result r;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buf{};
  size_t n = 0;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int raw = pclose(pipe);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

std::string write(const std::string& name, const std::string& text) {
  const std::string path = std::string(AFFINE_CLI_WORKDIR) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TensorMap rows() { return contiguous_split({"w", DType::f32, {8, 8}}, 0, {4, 4}); }
TensorMap cols() { return contiguous_split({"w", DType::f32, {8, 8}}, 1, {2, 2, 2, 2}); }

}  // namespace

TEST_CASE("tessera affine plan prints the plan and its statistics", "[affine][cli]") {
  const std::string src = write("cli_rows.json", map_to_json(rows()));
  const std::string dst = write("cli_cols.json", map_to_json(cols()));
  const Result r = run("affine plan --target " + dst + " --source " + src);
  REQUIRE(r.status == 0);
  const Plan printed = plan_from_json(r.out);  // also checks the printed digest
  CHECK(printed == affine::plan(cols(), rows()));
  CHECK(printed.statistics.segments == 8);
  CHECK(nlohmann::json::parse(r.out)["statistics"]["moved_bytes"] == 256);

  // DeepSpeed in and out, balanced policy.
  const std::string ds_src = write("cli_rows_ds.json", map_to_deepspeed_json(rows()));
  const Result d = run("affine plan --target " + dst + " --source " + ds_src + " --policy balanced --format deepspeed");
  REQUIRE(d.status == 0);
  CHECK(d.out.find("\"logical_shape\"") != std::string::npos);
  CHECK(d.out.find("\"policy\":\"balanced\"") != std::string::npos);
}

TEST_CASE("tessera affine plan refuses bad input with an error naming the problem", "[affine][cli]") {
  TensorMap half = rows();
  half.ranks.erase(1);
  const std::string bad = write("cli_half.json", map_to_json(half));
  const std::string dst = write("cli_cols2.json", map_to_json(cols()));
  const Result r = run("affine plan --target " + dst + " --source " + bad);
  CHECK(r.status == 1);
  CHECK(r.out.find("tensor 'w'") != std::string::npos);
  CHECK(r.out.find("cover 32 of its 64") != std::string::npos);
  const Result missing = run("affine plan --target " + dst + " --source /nonexistent/map.json");
  CHECK(missing.status == 1);
  CHECK(missing.out.find("cannot read map file") != std::string::npos);
  CHECK(run("affine plan --target " + dst + " --source " + dst + " --policy nearest").status != 0);
}

TEST_CASE("tessera affine check validates and prints pieces per rank", "[affine][cli]") {
  const std::string good = write("cli_check_good.json", maps_to_json({rows(), cols()}));
  const Result ok = run("affine check " + good);
  CHECK(ok.status == 0);
  CHECK(ok.out.find("2 of 2 maps valid") != std::string::npos);
  CHECK(ok.out.find("rank 3: 1 pieces, 16 elements") != std::string::npos);

  TensorMap swapped = rows();
  std::swap(swapped.ranks[0].pieces, swapped.ranks[1].pieces);  // negative control
  const std::string bad = write("cli_check_bad.json", maps_to_json({cols(), swapped}));
  const Result no = run("affine check " + bad);
  CHECK(no.status == 1);
  CHECK(no.out.find("1 of 2 maps valid") != std::string::npos);
  CHECK(no.out.find("Box((4,0)+(4,8))") != std::string::npos);
  const std::string garbage = write("cli_check_garbage.json", "{\"format\": \"tessera.map\", \"version\": 1,");
  CHECK(run("affine check " + garbage).status == 1);
}
