// Training -> rollout sync across two jobs started by tests/transport/two_jobs.py (roles "train"
// and "rollout" in TESSERA_UCX_ROLE): a DP-2 ZeRO engine at stages 1, 2 and 3 trains a Llama (every
// bias, 2 KV heads) and a Qwen2 (tied, 1 KV head: replicated at TP 4, padded vocabulary), syncs
// into a RolloutEngine at TP 2 or 4 whose weights start as NaN, twice (plans reused). Oracle: after
// each sync the training job's rank 0 saves the model as safetensors; the rollout ranks load it
// whole, cut their shards (cut_shard) and compare bit for bit. Padding rows stay outside the map.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/config/load.h"
#include "core/nn/decoder.h"
#include "tests/nn/decoder_models.h"
#include "tests/rollout/two_job_process.h"
#include "transport/launch_env.h"
#include "transport/store.h"
#include "actors/actor_runtime.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

using testing::env;
using testing::kEnv;
using testing::kTraining;


fs::path oracle_dir(const std::string& session, int round) {
  return fs::temp_directory_path() / ("tessera_sync_" + env("MASTER_PORT") + "_" + session + "_" + std::to_string(round));
}

WeightSyncOptions sync_options(const std::string& session) {
  WeightSyncOptions o;
  o.train_job = kTraining ? kEnv.job : env("TESSERA_PEER_JOB");
  o.rollout_job = kTraining ? env("TESSERA_PEER_JOB") : kEnv.job;
  o.session = session;
  o.timeout = std::chrono::seconds(90);
  using Kind = affine::ReplicaPolicyKind;
  o.replica_policy = session.find("stage1") != std::string::npos ? Kind::lowest : Kind::balanced;  // both policies
  if (session.find("local") != std::string::npos) o.replica_policy = Kind::local;
  o.delta = session.find("delta") != std::string::npos;
  // "budget": delta packets that cannot fit the staging budget (fp32: nearly every element changes),
  // so every sync is full; packing stops at the budget instead of building them whole.
  if (session.find("budget") != std::string::npos) o.staging_bytes = 16 << 10;
  // "stream": the training ranks copy into the rollout's mapped memory with streaming stores
  // (a real sync does above 32 MiB per rank; these models are a few hundred KB).
  if (session.find("stream") != std::string::npos) o.streaming_copy_bytes = 0;
  return o;
}

// Whether sync `round` of `session` is a delta (the first is always full; "budget" never fits).
bool expect_delta(const std::string& session, int round) {
  return round > 0 && session.find("delta") != std::string::npos && session.find("budget") == std::string::npos;
}

void train(const std::string& family, int stage, const std::string& session, int rounds = 2) {
  auto config = nn::testing::family_config(family);
  nn::DecoderOptions o;
  o.seed = 31;
  nn::DecoderLm model(config, o);
  nn::testing::randomize_norms_and_biases(model.module(), 32);
  std::string swap_dir;  // "param_nvme": the parameters' partitions on NVMe
  if (session.find("param_nvme") != std::string::npos) {
    swap_dir = (fs::temp_directory_path() / ("tessera_sync_swap_" + env("MASTER_PORT") + "_" + session)).string();
    fs::create_directories(swap_dir);
  }
  auto engine = initialize(model.module(), config::load_config_text(testing::sync_test_engine_toml(stage, swap_dir),
                                                                    config::Format::toml, "sync_test"))
                    .engine;
  // "local": training rank r on node r, rollout rank t on node (t + 1) % 2 (named, as on real
  // nodes; crossed, so that the lowest or a balanced choice would differ).
  const bool local = session.find("local") != std::string::npos;
  if (local) setenv("TESSERA_NODE_NAME", ("node" + std::to_string(kEnv.rank)).c_str(), 1);
  WeightSender sender(*engine, config, sync_options(session));
  unsetenv("TESSERA_NODE_NAME");
  auto marks = actors::job_store()->shared("synctest/" + session);
  for (int round = 0; round < rounds; ++round) {
    for (int step = 0; step < 2; ++step) {
      auto g = at::detail::createCPUGenerator(uint64_t(1000 * round + 10 * step + kEnv.rank));
      auto tokens = torch::randint(0, config.vocab_size, {2, 13}, g, torch::kLong);
      engine->backward(model.loss(tokens.narrow(1, 0, 12), tokens.narrow(1, 1, 12)));
      engine->step();
    }
    const auto stats = sender.sync();
    if (kEnv.rank == 0)
      std::printf("%s round %d: sent %lld bytes in %lld puts, plan %.1f ms, sync %.1f ms, verify %.1f ms, cast %.1f ms "
                  "(mirror %lld bytes), delta %d (%lld elements changed; a full sync sends %lld bytes)\n", session.c_str(),
                  round, static_cast<long long>(stats.bytes_sent), static_cast<long long>(stats.puts), stats.plan_ms,
                  stats.sync_ms, stats.verify_ms, stats.cast_ms, static_cast<long long>(stats.cast_mirror_bytes),
                  int(stats.delta), static_cast<long long>(stats.changed_elements), static_cast<long long>(stats.full_bytes));
    CHECK((round == 0) == (stats.plan_ms > 0));
    CHECK(stats.delta == expect_delta(session, round));
    // Streaming: every byte copied straight into the rollout's memory, mapped here (one machine).
    if (session.find("stream") != std::string::npos) CHECK(stats.bytes_mapped == stats.bytes_sent);
    if (session.find("budget") != std::string::npos && round > 0) CHECK(stats.changed_elements > 0);  // it did try
    if (local) {  // this rank sent exactly what the rollout ranks on its node received
      const int rollout_size = std::stoi(marks->get_string("rollout_size", std::chrono::seconds(90)));
      int64_t on_my_node = 0;
      for (int t = 1 - kEnv.rank; t < rollout_size; t += 2)
        on_my_node += std::stoll(marks->get_string("received" + std::to_string(round) + "/" + std::to_string(t),
                                                   std::chrono::seconds(90)));
      CHECK(stats.bytes_sent == on_my_node);
      CHECK(on_my_node > 0);
    }
    {
      auto gathered = engine->gathered_parameters();  // stage 3: every rank gathers, rank 0 saves
      if (kEnv.rank == 0) {
        model.save_pretrained(oracle_dir(session, round).string());
        marks->set("saved" + std::to_string(round), "1");
      }
    }
  }
}

void receive(const std::string& family, const std::string& session, at::ScalarType dtype = at::kFloat, int rounds = 2) {
  const auto config = nn::testing::family_config(family);
  const auto dir = fs::temp_directory_path() / ("tessera_sync_cfg_" + env("MASTER_PORT") + "_" + std::to_string(kEnv.rank));
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << nn::decoder_config_json(config);
  RolloutOptions ro;
  ro.config_path = (dir / "config.json").string();
  ro.dtype = dtype;
  auto rollout = RolloutEngine::create(ro);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : rollout->model().module()->parameters()) p.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  if (session.find("local") != std::string::npos)
    setenv("TESSERA_NODE_NAME", ("node" + std::to_string((kEnv.rank + 1) % 2)).c_str(), 1);
  RolloutSink sink(*rollout, sync_options(session));
  unsetenv("TESSERA_NODE_NAME");
  auto marks = actors::job_store()->shared("synctest/" + session);
  if (kEnv.rank == 0) marks->set("rollout_size", std::to_string(kEnv.world_size));
  std::map<std::string, torch::Tensor> previous;
  for (int round = 0; round < rounds; ++round) {
    const auto stats = sink.receive();
    CHECK(stats.version == uint64_t(round + 1));
    const bool delta = expect_delta(session, round);
    CHECK(stats.delta == delta);
    if (!delta) CHECK(stats.wire_to_useful == 1.0);
    CHECK(stats.pause_ms > 0);
    marks->set("received" + std::to_string(round) + "/" + std::to_string(kEnv.rank), std::to_string(stats.bytes_sent));
    marks->get("saved" + std::to_string(round), std::chrono::seconds(90));
    const auto oracle = nn::load_pretrained(oracle_dir(session, round).string());
    auto mine = rollout->model().module()->named_parameters();
    int64_t compared = 0;
    for (const auto& item : oracle.module()->named_parameters()) {
      const auto& name = item.key();
      INFO(session << " round " << round << " " << name << " TP rank " << kEnv.rank);
      const auto shard = nn::decoder_tp_shard(config, name, kEnv.rank, kEnv.world_size);
      // bf16 rollout: the oracle is LibTorch's own cast of the fp32 weights.
      auto expected = nn::cut_shard(item.value().detach(), shard).to(dtype), got = mine[name].detach();
      if (shard.dim >= 0 && shard.local_length > shard.length) {
        CHECK(torch::isnan(got.narrow(shard.dim, shard.length, shard.local_length - shard.length)).all().item<bool>());
        expected = expected.narrow(shard.dim, 0, shard.length), got = got.narrow(shard.dim, 0, shard.length);
      }
      CHECK(torch::equal(got, expected));  // bitwise; NaN anywhere would fail
      if (round > 0) CHECK_FALSE(torch::equal(got, previous.at(name)));  // training moved every weight
      previous[name] = got.clone();
      compared += got.numel();
    }
    CHECK(compared > 0);
    // The synced weights generate.
    nn::SamplingParams greedy;
    greedy.temperature = 0, greedy.max_new_tokens = 4, greedy.ignore_eos = true;
    const auto out = rollout->generate({{3, 4, 5}, {6}}, greedy);
    for (const auto& lps : out.logprobs)
      for (float lp : lps) CHECK(std::isfinite(lp));
  }
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("Training at DP 2 (stages 1, 2, 3) syncs into a rollout TP group bit for bit, twice", "[.sync]") {
  for (const std::string family : {"llama", "qwen2"}) {
    for (int stage : {1, 2, 3}) {
      const auto session = family + "_stage" + std::to_string(stage);
      if (kTraining) train(family, stage, session);
      else receive(family, session);
    }
  }
  // fp32 training -> bf16 rollout, cast on the way.
  if (kTraining) train("qwen2", 2, "qwen2_bf16");
  else receive("qwen2", "qwen2_bf16", at::kBFloat16);
  // Delta syncs after the first: bitwise the same result as full ones (the same oracle), in fp32
  // (nearly every element changes: dense segments) and in bf16 (sparse changes).
  if (kTraining) train("llama", 2, "llama_delta", 3);
  else receive("llama", "llama_delta", at::kFloat, 3);
  if (kTraining) train("qwen2", 1, "qwen2_bf16_delta_stage1", 3);
  else receive("qwen2", "qwen2_bf16_delta_stage1", at::kBFloat16, 3);
  // Delta packets over the staging budget: full syncs instead, still exact.
  if (kTraining) train("llama", 2, "llama_delta_budget", 2);
  else receive("llama", "llama_delta_budget", at::kFloat, 2);
  // Streaming stores into the mapped targets (stage 2, and stage 3 partitions).
  if (kTraining) train("llama", 2, "llama_stream_stage2");
  else receive("llama", "llama_stream_stage2");
  if (kTraining) train("qwen2", 3, "qwen2_stream_stage3");
  else receive("qwen2", "qwen2_stream_stage3");
  // Stage 3 with the parameters on NVMe: each sync pages this step's partitions in (full, then delta).
  if (kTraining) train("llama", 3, "llama_param_nvme_delta", 3);
  else receive("llama", "llama_param_nvme_delta", at::kFloat, 3);
  // Replicas read on the rollout rank's node.
  if (kTraining) train("llama", 2, "llama_local");
  else receive("llama", "llama_local");
  // A corrupted byte on one rollout rank is caught by the hashes on every rank of both jobs; that
  // rank's engine refuses to generate until the next, good, sync.
  {
    const std::string session = "tampered";
    auto options = sync_options(session);
    auto armed = std::make_shared<bool>(false);  // the second sync only
    if (!kTraining && kEnv.rank == kEnv.world_size - 1)
      options.tamper_for_testing = [armed](const std::string& name, at::Tensor& local) {
        if (*armed && name == "model.layers.1.mlp.down_proj.weight") reinterpret_cast<uint8_t*>(local.data_ptr())[5] ^= 0x10;
      };
    const auto config = nn::testing::family_config("llama");
    if (kTraining) {
      nn::DecoderLm model(config);
      auto engine =
          initialize(model.module(), config::load_config_text(testing::sync_test_engine_toml(2), config::Format::toml, "sync_test")).engine;
      WeightSender sender(*engine, config, options);
      sender.sync();
      CHECK_THROWS_WITH(sender.sync(), Catch::Contains("did not verify") &&
                                           Catch::Contains("model.layers.1.mlp.down_proj.weight") &&
                                           Catch::Contains("to rollout rank "));
      CHECK(sender.sync().bytes_sent >= 0);  // the next sync is good again
    } else {
      const auto dir = fs::temp_directory_path() / ("tessera_sync_cfg_" + env("MASTER_PORT") + "_" + std::to_string(kEnv.rank));
      fs::create_directories(dir);
      std::ofstream(dir / "config.json") << nn::decoder_config_json(config);
      RolloutOptions ro;
      ro.config_path = (dir / "config.json").string();
      auto rollout = RolloutEngine::create(ro);
      RolloutSink sink(*rollout, options);
      CHECK(sink.receive().version == 1);
      *armed = true;
      CHECK_THROWS_WITH(sink.receive(), Catch::Contains("failed verification") &&
                                            Catch::Contains("model.layers.1.mlp.down_proj.weight"));
      CHECK(rollout->weights_torn());
      CHECK(rollout->weight_version() == 1);
      CHECK_THROWS_WITH(rollout->generate({{1}}, {}), Catch::Contains("last weight sync (in place) failed"));
      *armed = false;
      CHECK(sink.receive().version == 2);
      CHECK_FALSE(rollout->weights_torn());
      CHECK(rollout->generate({{1}}, {}).tokens.size() == 1);
      fs::remove_all(dir);
    }
  }
  // Different models on the two sides: both refuse, with the same message, before any byte moves.
  if (kTraining) {
    auto config = nn::testing::family_config("llama");
    nn::DecoderLm model(config);
    auto engine =
        initialize(model.module(), config::load_config_text(testing::sync_test_engine_toml(1), config::Format::toml, "sync_test")).engine;
    CHECK_THROWS_WITH(WeightSender(*engine, config, sync_options("mismatch")),
                      Catch::Contains("the two jobs' models differ") && Catch::Contains("qwen3"));
  } else {
    const auto dir = fs::temp_directory_path() / ("tessera_sync_cfg_" + env("MASTER_PORT") + "_" + std::to_string(kEnv.rank));
    fs::create_directories(dir);
    std::ofstream(dir / "config.json") << nn::decoder_config_json(nn::testing::family_config("qwen3"));
    RolloutOptions ro;
    ro.config_path = (dir / "config.json").string();
    auto rollout = RolloutEngine::create(ro);
    CHECK_THROWS_WITH(RolloutSink(*rollout, sync_options("mismatch")),
                      Catch::Contains("the two jobs' models differ") && Catch::Contains("llama"));
    fs::remove_all(dir);
  }
  if (!kTraining && kEnv.rank == 0)
    for (const std::string family : {"llama", "qwen2"})
      for (int stage : {1, 2, 3})
        for (int round : {0, 1}) fs::remove_all(oracle_dir(family + "_stage" + std::to_string(stage), round));
  if (!kTraining && kEnv.rank == 0) {
    for (int round : {0, 1}) fs::remove_all(oracle_dir("qwen2_bf16", round));
    for (int round : {0, 1, 2}) fs::remove_all(oracle_dir("llama_delta", round));
    for (int round : {0, 1, 2}) fs::remove_all(oracle_dir("qwen2_bf16_delta_stage1", round));
    for (int round : {0, 1}) fs::remove_all(oracle_dir("llama_delta_budget", round));
    for (const char* session : {"llama_stream_stage2", "qwen2_stream_stage3"})
      for (int round : {0, 1}) fs::remove_all(oracle_dir(session, round));
    for (int round : {0, 1}) fs::remove_all(oracle_dir("llama_local", round));
    for (int round : {0, 1, 2}) fs::remove_all(oracle_dir("llama_param_nvme_delta", round));
  }
  if (kTraining && kEnv.rank == 0)  // its engine is gone: the swap files with it
    fs::remove_all(fs::temp_directory_path() / ("tessera_sync_swap_" + env("MASTER_PORT") + "_llama_param_nvme_delta"));
}
