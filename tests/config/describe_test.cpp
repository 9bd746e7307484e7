// describe(): one line per value with its provenance, as `tessera config check` prints it.
#include <catch2/catch.hpp>

#include "core/config/describe.h"
#include "core/config/resolve_auto.h"
#include "tests/config/test_util.h"

using namespace tessera::config;
using tessera::config::test::load_json;

TEST_CASE("describe marks given, default, derived, auto, ignored and unsupported values", "[config][describe]") {
  const Config c = load_json(R"({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto",
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "zero_quantized_weights": true},
      "wandb": {"enabled": false}, "sparse_gradients": true})");
  Facts f;
  f.world_size = 2, f.hidden_size = 8, f.gradient_accumulation_steps = 3;
  const std::string before = describe(c);
  CHECK_THAT(before, Catch::Contains("train_micro_batch_size_per_gpu = 4"));
  CHECK_THAT(before, Catch::Contains("# given"));
  CHECK_THAT(before, Catch::Contains("zero_optimization.reduce_bucket_size = \"auto\""));
  CHECK_THAT(before, Catch::Contains("# auto: waits for the model's hidden size (--hidden-size)"));
  CHECK_THAT(before, Catch::Contains("zero_optimization.overlap_comm = true"));
  CHECK_THAT(before, Catch::Contains("# default: true with stage 3"));
  CHECK_THAT(before, Catch::Contains("wandb = {\"enabled\": false}"));
  CHECK_THAT(before, Catch::Contains("# ignored"));
  CHECK_THAT(before, Catch::Contains("sparse_gradients = true"));
  CHECK_THAT(before, Catch::Contains("# not yet supported"));
  CHECK_THAT(before, Catch::Contains("# given; not yet supported"));  // zero_quantized_weights
  const std::string waiting = describe(resolve_known(c, Facts{}));  // what `tessera config check` prints
  CHECK_THAT(waiting, Catch::Contains("train_batch_size = (not known yet)"));
  CHECK_THAT(waiting, Catch::Contains("# derived later: waits for the world size (--world-size)"));
  const std::string after = describe(resolve_known(c, f));
  CHECK_THAT(after, Catch::Contains("zero_optimization.reduce_bucket_size = 64"));
  CHECK_THAT(after, Catch::Contains("# derived: hidden size 8 squared"));
  CHECK_THAT(after, Catch::Contains("train_batch_size = 24"));  // 4 x 3 x 2
  CHECK_THAT(after, Catch::Contains("# derived: 4 x 3 x 2"));
}

namespace {
// The mark describe() gives the line of `assignment` ("" when there is none).
std::string mark_of(const std::string& text, const std::string& assignment) {
  const size_t at = text.find("\n" + assignment + " ");
  if (at == std::string::npos) return "";
  const size_t mark = text.find("# ", at), end = text.find('\n', at + 1);
  return mark < end ? text.substr(mark + 2, end - mark - 2) : "";
}
}  // namespace

TEST_CASE("AutoTP training, which the engine lacks, is marked not yet supported; optimizer and parameter "
          "offload to host memory and to NVMe are not", "[config][describe]") {
  const Config c = load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/nvme"}, "offload_param": {"device": "nvme", "nvme_path": "/nvme"}}, "tensor_parallel": {"autotp_size": 1}})");
  const std::string text = describe(c);
  INFO(text);
  CHECK(mark_of(text, "zero_optimization.offload_optimizer.device = \"nvme\"") == "given");
  CHECK(mark_of(text, "zero_optimization.offload_param.device = \"nvme\"") == "given");
  CHECK(mark_of(text, "zero_optimization.offload_optimizer.nvme_path = \"/nvme\"") == "given");
  CHECK(c.unsupported.empty());
  const Config host = load_json(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}}})");
  CHECK(host.unsupported.empty());
  CHECK(mark_of(describe(host), "zero_optimization.offload_param.device = \"cpu\"") == "given");
  // Optimizer offload to host memory is supported: given, nothing unsupported.
  const Config cpu = load_json(R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})");
  CHECK(cpu.unsupported.empty());
  CHECK(mark_of(describe(cpu), "zero_optimization.offload_optimizer.device = \"cpu\"") == "given");
  // AutoTP: sizes 0 and 1 ask for nothing; 2 asks for tensor-parallel training.
  CHECK(load_json(R"({"tensor_parallel": {"autotp_size": 0}})").unsupported.empty());
  const Config tp = load_json(R"({"zero_optimization": {"stage": 2}, "tensor_parallel": {"autotp_size": 2}})");
  REQUIRE(tp.unsupported.size() == 1);
  CHECK(tp.unsupported[0].path == "tensor_parallel.autotp_size");
  CHECK(mark_of(describe(tp), "tensor_parallel.autotp_size = 2") == "given; not yet supported");
  // The device left "auto" asks for nothing until a fact resolves it.
  CHECK(load_json(R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "auto"}}})").unsupported.empty());
}

TEST_CASE("offload_optimizer.ratio: partial offload to host memory is supported, to NVMe marked not yet supported, "
          "outside [0, 1] an error, without offload a warning", "[config][describe]") {
  const Config cpu = load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 0.3}}})");
  INFO(describe(cpu));
  CHECK(cpu.unsupported.empty());
  CHECK(cpu.zero_optimization.offload_optimizer.ratio == 0.3);
  CHECK(mark_of(describe(cpu), "zero_optimization.offload_optimizer.ratio = 0.3") == "given");
  const Config nvme = load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/nvme", "ratio": 0.5}}})");
  REQUIRE(nvme.unsupported.size() == 1);
  CHECK(nvme.unsupported[0].path == "zero_optimization.offload_optimizer.ratio");
  CHECK(load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme",
      "nvme_path": "/nvme", "ratio": 1.0}}})").unsupported.empty());
  CHECK_THROWS_WITH(load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": 1.5}}})"),
                    Catch::Contains("zero_optimization.offload_optimizer.ratio") && Catch::Contains("[0, 1]"));
  CHECK_THROWS_WITH(load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu", "ratio": -0.1}}})"),
                    Catch::Contains("zero_optimization.offload_optimizer.ratio"));
  const Config none = load_json(R"({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "ratio": 0.5}}})");
  REQUIRE(none.warnings.size() == 1);
  CHECK_THAT(none.warnings[0], Catch::Contains("zero_optimization.offload_optimizer.ratio") && Catch::Contains("no effect"));
}
