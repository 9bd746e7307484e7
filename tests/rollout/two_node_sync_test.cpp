// Training -> rollout sync between "nodes" that share no loopback: tests/rollout/two_node_sync.py
// gives the training job (DP 2, ZeRO stage 2, hosting the store) one network namespace and each
// rank of the rollout job (TP 2, started as two node launchers: --nnodes 2 --node-rank 0/1) one of
// its own, linked by veth pairs over a bridge, with UCX restricted to TCP on that interface.
// What it proves, from inside the rollout ranks:
//   - placement: each rollout rank's only interface besides loopback is the link, and the store
//     (MASTER_ADDR) is not one of its addresses, so every byte from the training job crosses it;
//   - the sync: the weights (first NaN) arrive bit for bit, twice, as the training rank 0's
//     safetensors say (the oracle: loaded whole, cut with cut_shard), and the TP pair generates;
//   - the path: the link's received-bytes counter grows during each receive() by at least what
//     UCX delivered (shared memory between the namespaces would leave it nearly still).
// Each rollout rank writes what it received to TWO_NODE_DIR/rollout<rank>.bytes for the driver,
// which checks the counters again from outside.
#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/config/load.h"
#include "core/nn/decoder.h"
#include "tests/nn/decoder_models.h"
#include "tests/rollout/two_job_process.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace fs = std::filesystem;
using namespace tessera;

namespace {

using testing::env;
using testing::kEnv;
using testing::kTraining;
const std::string kLink = env("TWO_NODE_IFACE");     // the veth (or bridge) in this namespace
const fs::path kShared = env("TWO_NODE_DIR");        // a directory every namespace sees
constexpr int kSyncs = 2;

fs::path oracle_dir(int sync) { return kShared / ("oracle" + std::to_string(sync)); }

WeightSyncOptions sync_options() {
  WeightSyncOptions o;
  o.train_job = kTraining ? kEnv.job : env("TESSERA_PEER_JOB");
  o.rollout_job = kTraining ? env("TESSERA_PEER_JOB") : kEnv.job;
  o.session = "two_node";
  o.timeout = std::chrono::seconds(60);
  o.replica_policy = tessera::affine::ReplicaPolicyKind::balanced;  // both training ranks send
  return o;
}

// This process's IPv4 addresses by interface, loopback left out.
std::map<std::string, std::string> own_addresses() {
  std::map<std::string, std::string> out;
  ifaddrs* list = nullptr;
  REQUIRE(getifaddrs(&list) == 0);
  for (auto* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || std::string(a->ifa_name) == "lo") continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    out[a->ifa_name] = text;
  }
  freeifaddrs(list);
  return out;
}

int64_t link_rx_bytes() {
  std::ifstream f("/sys/class/net/" + kLink + "/statistics/rx_bytes");
  int64_t bytes = -1;
  f >> bytes;
  REQUIRE(bytes >= 0);
  return bytes;
}

void train() {
  const auto addresses = own_addresses();
  REQUIRE(addresses.count(kLink) == 1);
  CHECK(addresses.at(kLink) == env("MASTER_ADDR"));  // this node hosts the store, on the link
  auto config = nn::testing::family_config("llama");
  nn::DecoderOptions o;
  o.seed = 31;
  nn::DecoderLm model(config, o);
  nn::testing::randomize_norms_and_biases(model.module(), 32);
  auto engine = initialize(model.module(), config::load_config_text(testing::sync_test_engine_toml(2), config::Format::toml, "two_node")).engine;
  WeightSender sender(*engine, config, sync_options());
  auto marks = actors::job_store()->shared("two_node_test");
  for (int sync = 0; sync < kSyncs; ++sync) {
    for (int step = 0; step < 2; ++step) {
      auto g = at::detail::createCPUGenerator(uint64_t(1000 * sync + 10 * step + kEnv.rank));
      auto tokens = torch::randint(0, config.vocab_size, {2, 13}, g, torch::kLong);
      engine->backward(model.loss(tokens.narrow(1, 0, 12), tokens.narrow(1, 1, 12)));
      engine->step();
    }
    const auto stats = sender.sync();
    std::printf("training rank %d sync %d: sent %lld bytes in %lld puts over %s, sync %.1f ms\n", kEnv.rank, sync,
                static_cast<long long>(stats.bytes_sent), static_cast<long long>(stats.puts), kLink.c_str(),
                stats.sync_ms);
    CHECK(stats.bytes_sent > 0);  // balanced: every training rank sends its share
    if (kEnv.rank == 0) {
      model.save_pretrained(oracle_dir(sync).string());
      marks->set("saved" + std::to_string(sync), "1");
    }
  }
  // The store's host stays until every rollout rank has read its last mark.
  if (kEnv.rank == 0)
    for (int r = 0; r < std::stoi(env("TWO_NODE_ROLLOUT_RANKS")); ++r)
      marks->get("checked" + std::to_string(r), std::chrono::seconds(60));
}

void compare_with_oracle(RolloutEngine& rollout, const nn::DecoderConfig& config, int sync,
                         std::map<std::string, torch::Tensor>& previous) {
  const auto oracle = nn::load_pretrained(oracle_dir(sync).string());
  auto mine = rollout.model().module()->named_parameters();
  int64_t compared = 0;
  for (const auto& item : oracle.module()->named_parameters()) {
    const auto& name = item.key();
    INFO("sync " << sync << " " << name << " TP rank " << kEnv.rank);
    const auto shard = nn::decoder_tp_shard(config, name, kEnv.rank, kEnv.world_size);
    auto expected = nn::cut_shard(item.value().detach(), shard), got = mine[name].detach();
    if (shard.dim >= 0 && shard.local_length > shard.length) {  // padding rows: outside the map, still NaN
      CHECK(torch::isnan(got.narrow(shard.dim, shard.length, shard.local_length - shard.length)).all().item<bool>());
      expected = expected.narrow(shard.dim, 0, shard.length), got = got.narrow(shard.dim, 0, shard.length);
    }
    CHECK(torch::equal(got, expected));  // bitwise; a NaN left anywhere fails
    if (sync > 0) CHECK_FALSE(torch::equal(got, previous.at(name)));  // training moved every weight
    previous[name] = got.clone();
    compared += got.numel();
  }
  CHECK(compared > 0);
}

void receive() {
  // Placement: the link is this namespace's only way out, and the store is elsewhere.
  const auto addresses = own_addresses();
  REQUIRE(addresses.size() == 1);
  REQUIRE(addresses.count(kLink) == 1);
  CHECK(addresses.at(kLink) != env("MASTER_ADDR"));
  std::printf("rollout rank %d (node %d of %d): %s %s, store at %s on another node\n", kEnv.rank, kEnv.rank,
              kEnv.world_size, kLink.c_str(), addresses.at(kLink).c_str(), env("MASTER_ADDR").c_str());

  const auto config = nn::testing::family_config("llama");
  const auto config_dir = kShared / ("config_rank" + std::to_string(kEnv.rank));
  fs::create_directories(config_dir);
  std::ofstream(config_dir / "config.json") << nn::decoder_config_json(config);
  RolloutOptions ro;
  ro.config_path = (config_dir / "config.json").string();
  auto rollout = RolloutEngine::create(ro);  // the TP pair meets across the link (Gloo)
  {
    torch::NoGradGuard no_grad;
    for (auto& p : rollout->model().module()->parameters()) p.fill_(std::numeric_limits<float>::quiet_NaN());
  }
  RolloutSink sink(*rollout, sync_options());
  auto marks = actors::job_store()->shared("two_node_test");
  std::map<std::string, torch::Tensor> previous;
  int64_t received = 0, link_grew = 0;
  for (int sync = 0; sync < kSyncs; ++sync) {
    // The transfer starts only once every process of both jobs is in the batch, so all its bytes
    // arrive between these two readings.
    const int64_t before = link_rx_bytes();
    const auto stats = sink.receive();
    const int64_t grew = link_rx_bytes() - before;
    std::printf("rollout rank %d sync %d: UCX delivered %lld bytes; %s received %lld bytes meanwhile (%.2fx)\n",
                kEnv.rank, sync, static_cast<long long>(stats.bytes_sent), kLink.c_str(), static_cast<long long>(grew),
                double(grew) / double(std::max<int64_t>(1, stats.bytes_sent)));
    CHECK(stats.version == uint64_t(sync + 1));
    CHECK(stats.wire_to_useful == 1.0);
    CHECK(stats.bytes_sent > 0);
    CHECK(grew >= stats.bytes_sent);  // every synced byte crossed the link
    received += stats.bytes_sent, link_grew += grew;
    marks->get("saved" + std::to_string(sync), std::chrono::seconds(60));
    compare_with_oracle(*rollout, config, sync, previous);
    nn::SamplingParams greedy;
    greedy.temperature = 0, greedy.max_new_tokens = 4, greedy.ignore_eos = true;
    const auto out = rollout->generate({{3, 4, 5}, {6}}, greedy);  // the TP pair over the link
    for (const auto& lps : out.logprobs)
      for (float lp : lps) CHECK(std::isfinite(lp));
  }
  std::ofstream(kShared / ("rollout" + std::to_string(kEnv.rank) + ".bytes")) << received << " " << link_grew << "\n";
  marks->set("checked" + std::to_string(kEnv.rank), "1");
}

}  // namespace

TEST_CASE("A rollout job on two other nodes receives the training weights over TCP, bit for bit", "[.two_node]") {
  REQUIRE_FALSE(kLink.empty());  // started by two_node_sync.py
  REQUIRE_FALSE(kShared.empty());
  if (kTraining) train();
  else receive();
}
