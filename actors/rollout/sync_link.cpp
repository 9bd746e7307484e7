#include "actors/rollout/sync_link.h"

#include <c10/util/Exception.h>
#include <c10/core/ScalarType.h>

#include <unistd.h>

#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>

#include "actors/actor_runtime.h"
#include "core/affine/planner.h"
#include "core/affine/segment_digest.h"
#include "core/affine/serialize.h"
#include "core/error.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_peers.h"

namespace tessera {

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

affine::DType affine_dtype(at::ScalarType t, const std::string& what) {
  if (t == at::kFloat) return affine::DType::f32;
  if (t == at::kBFloat16) return affine::DType::bf16;
  if (t == at::kHalf) return affine::DType::f16;
  throw ConfigError("weight sync: " + what + " is " + std::string(c10::toString(t)) + "; weights sync as fp32, bf16 or fp16");
}

std::string node_name() {
  if (const char* name = std::getenv("TESSERA_NODE_NAME"); name && *name) return name;
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) return "localhost";
  return host;
}

WeightSyncOptions weight_sync_options(const config::Config& config, WeightSyncOptions options) {
  const config::RolloutConfig& r = config.tessera.rollout;
  options.replica_policy = r.replica_policy;
  options.staging_bytes = r.staging_budget_bytes;
  options.timeout = std::chrono::milliseconds(r.sync_timeout_ms);
  return options;
}

SyncLink::SyncLink(const WeightSyncOptions& o, bool is_training, int my_rank, int my_size)
    : options(o), training(is_training), rank(my_rank), size(my_size) {
  if (o.replica_policy == affine::ReplicaPolicyKind::callback)
    throw ConfigError("weight sync: replica_policy callback needs code on both jobs; use lowest, local or balanced");
  if (o.train_job.empty() || o.rollout_job.empty() || o.train_job == o.rollout_job)
    throw ConfigError("weight sync: train_job and rollout_job must name the two jobs (got '" + o.train_job + "', '" +
                      o.rollout_job + "')");
  store = actors::own_job_store_connection();  // the sink's actor must not queue behind the user's waits
  shared = store->shared("sync/" + o.session);
}

SyncLink::~SyncLink() = default;

void SyncLink::connect() {
  context = std::make_shared<transport::UcxContext>(transport::UcxContextOptions{});
  peers = std::make_unique<transport::UcxPeers>(*context, store, training ? options.train_job : options.rollout_job,
                                                rank, size, "sync/" + options.session);
  peer_size = peers->connect(training ? options.rollout_job : options.train_job);
  transport::RemoteExecutorOptions eo;
  eo.staging_bytes = options.staging_bytes;
  eo.streaming_copy_bytes = options.streaming_copy_bytes;
  eo.timeout = options.timeout;
  executor = std::make_unique<transport::RemoteExecutor>(*peers, "sync/" + options.session, eo);
}

// Each side publishes its config and size, reads the other's, acknowledges, and waits for every
// rank of the other side to have acknowledged; only then does it refuse a mismatch or go on. So no
// side leaves while the other still needs it.
void SyncLink::agree_on_config(const std::string& config_json) {
  const std::string role = training ? "train" : "rollout", peer_role = training ? "rollout" : "train";
  const std::string own = config_json + "replica_policy: " + affine::name_of(options.replica_policy) + "\ndelta: " +
                          (options.delta ? "on" : "off") + "\n";
  if (rank == 0) {
    shared->set(role + "_config", own);
    shared->set(role + "_size", std::to_string(size));
  }
  shared->set("node/" + role + "/" + std::to_string(rank), node_name());  // before the ack: read after it
  std::string theirs;
  try {
    theirs = shared->get_string(peer_role + "_config", options.timeout);
    peer_size = std::stoi(shared->get_string(peer_role + "_size", options.timeout));
    shared->set("ack/" + role + "/" + std::to_string(rank), "1");
    std::vector<std::string> acks;
    for (int r = 0; r < peer_size; ++r) acks.push_back("ack/" + peer_role + "/" + std::to_string(r));
    shared->wait(acks, options.timeout);
    for (int r = 0; r < train_size(); ++r) train_nodes.push_back(shared->get_string("node/train/" + std::to_string(r), options.timeout));
    for (int r = 0; r < rollout_size(); ++r)
      rollout_nodes.push_back(shared->get_string("node/rollout/" + std::to_string(r), options.timeout));
    rollout_finished("agreed/");
  } catch (const TimeoutError&) {
    throw TimeoutError("weight sync '" + options.session + "': the " + (training ? "rollout job '" + options.rollout_job : "training job '" + options.train_job) +
                       "' did not meet within " + std::to_string(options.timeout.count()) +
                       " ms (is it up, with the same store, secret and session?)");
  }
  if (theirs != own) {
    const auto& train = training ? own : theirs;
    const auto& rollout = training ? theirs : own;
    throw ConfigError("weight sync '" + options.session + "': the two jobs' models differ; training job '" +
                      options.train_job + "' has " + train + "rollout job '" + options.rollout_job + "' has " + rollout);
  }
}

double SyncLink::plan_once() {
  if (planned) return 0;
  const auto t = std::chrono::steady_clock::now();
  plans.clear();
  affine::PlanOptions po;
  affine::Placement placement;  // the local policy's tables
  if (options.replica_policy == affine::ReplicaPolicyKind::local) {
    // Processes: training ranks first, then rollout ranks; nodes by name.
    std::map<std::string, int> node_ids;
    auto node_id = [&](const std::string& name) { return node_ids.emplace(name, int(node_ids.size())).first->second; };
    for (int r = 0; r < train_size(); ++r) {
      placement.source_process[r] = r;
      placement.process_node[r] = node_id(train_nodes[size_t(r)]);
    }
    for (int r = 0; r < rollout_size(); ++r) {
      placement.target_process[r] = train_size() + r;
      placement.process_node[train_size() + r] = node_id(rollout_nodes[size_t(r)]);
    }
  }
  po.policy = affine::ReplicaPolicy::of(options.replica_policy, std::move(placement));
  for (size_t i = 0; i < targets.size(); ++i) plans.push_back(affine::plan(targets[i], sources[i], po));
  planned = true;
  return ms_since(t);
}

void SyncLink::mark_start() {
  if (training && rank == 0) shared->set(key("start", ""), "1");
}

bool SyncLink::wait_for_start(std::chrono::milliseconds timeout, const std::atomic<bool>* stop) {
  const auto k = key("start", "");
  if (!stop) {
    try {
      shared->wait({k}, timeout);
    } catch (const TimeoutError& e) {
      // The store's own words name the key waited for (as every other wait of a sync does).
      throw TimeoutError("weight sync '" + options.session + "': the training job '" + options.train_job +
                         "' did not start sync " + std::to_string(syncs + 1) + " within " +
                         std::to_string(timeout.count()) + " ms (" + e.what() + ")");
    }
    return true;
  }
  while (!stop->load()) {
    if (shared->check({k})) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

std::vector<std::vector<int64_t>> SyncLink::agree_on_packets(const std::vector<int64_t>& mine) {
  if (training) {
    std::string text = mine.empty() ? "full" : "";
    for (auto n : mine) text += std::to_string(n) + " ";
    shared->set(key("packets", std::to_string(rank)), text);
  }
  std::vector<std::vector<int64_t>> sizes(train_size());
  bool full = false;
  for (int s = 0; s < train_size(); ++s) {
    const auto text = shared->get_string(key("packets", std::to_string(s)), options.timeout);
    if (text == "full") full = true;
    std::istringstream in(text);
    for (int64_t n; in >> n;) sizes[s].push_back(n);
    if (!full && int(sizes[s].size()) != rollout_size())
      throw TransportError("weight sync '" + options.session + "': training rank " + std::to_string(s) + " announced " +
                           std::to_string(sizes[s].size()) + " delta packets for " + std::to_string(rollout_size()) +
                           " rollout ranks");
  }
  rollout_finished(key("packets_read", ""));
  if (full) sizes.clear();
  return sizes;
}

std::vector<transport::RemoteTransfer> SyncLink::packet_batch(const std::vector<std::vector<int64_t>>& sizes) {
  packet_plans.clear();
  packet_pairs.clear();
  for (int s = 0; s < int(sizes.size()); ++s)
    for (int t = 0; t < int(sizes[s].size()); ++t) {
      if (sizes[s][t] == 0) continue;
      // One byte tensor held whole by one rank on each side.
      affine::TensorMap map;
      map.name = "delta packet " + std::to_string(s) + "->" + std::to_string(t);
      map.dtype = affine::DType::u8;
      map.shape = affine::Dims{sizes[s][t]};
      affine::RankStorage whole;
      whole.buffer_elements = sizes[s][t];
      whole.buffer_shape = map.shape;
      whole.pieces.push_back({affine::Box::whole(map.shape), 0, affine::Dims{1}, {0}});
      map.ranks[0] = whole;
      packet_plans.push_back(affine::plan(map, map));
      packet_pairs.push_back({s, t});
    }
  std::vector<transport::RemoteTransfer> batch(packet_plans.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    batch[i].plan = &packet_plans[i];
    batch[i].source_processes = {{options.train_job, packet_pairs[i].first}};
    batch[i].target_processes = {{options.rollout_job, packet_pairs[i].second}};
  }
  return batch;
}

std::map<int, std::string> SyncLink::source_digests(const std::vector<transport::RemoteTransfer>& batch) const {
  std::map<int, std::string> per_target;  // "<plan>:<hex> ..." per rollout rank
  for (size_t i = 0; i < batch.size(); ++i)
    for (const auto& [pair, digest] : affine::segment_digests(plans[i], batch[i].source_buffers, true))
      per_target[pair.second] += std::to_string(i) + ":" + affine::hex_digest(digest) + " ";
  return per_target;
}

void SyncLink::publish_source_digests(const std::map<int, std::string>& per_target) {
  for (int t = 0; t < peer_size; ++t) {
    const auto text = per_target.find(t);
    shared->set(key("digests", std::to_string(rank) + "/" + std::to_string(t)), text == per_target.end() ? "" : text->second);
  }
}

std::string SyncLink::verify_target_digests(const std::vector<transport::RemoteTransfer>& batch) {
  std::map<std::pair<size_t, int>, uint64_t> mine;  // (plan, training rank) -> digest
  for (size_t i = 0; i < batch.size(); ++i)
    for (const auto& [pair, digest] : affine::segment_digests(plans[i], batch[i].target_buffers, false))
      mine[{i, pair.first}] = digest;
  std::string problems;
  for (int s = 0; s < peer_size; ++s) {
    std::map<size_t, std::string> sent;
    std::istringstream in(shared->get_string(key("digests", std::to_string(s) + "/" + std::to_string(rank)), options.timeout));
    for (std::string item; in >> item;) sent[std::stoul(item.substr(0, item.find(':')))] = item.substr(item.find(':') + 1);
    for (const auto& [plan_and_rank, digest] : mine) {
      if (plan_and_rank.second != s) continue;
      auto it = sent.find(plan_and_rank.first);
      if (it == sent.end() || it->second != affine::hex_digest(digest))
        problems += "tensor '" + plans[plan_and_rank.first].name + "' from training rank " + std::to_string(s) +
                    " to rollout rank " + std::to_string(rank) + ": digest " + affine::hex_digest(digest) + " received, " +
                    (it == sent.end() ? std::string("none") : it->second) + " sent; ";
    }
  }
  return problems;
}

std::string SyncLink::all_verdicts(const std::string& mine_if_rollout) {
  if (!training) shared->set(key("verdict", std::to_string(rank)), mine_if_rollout.empty() ? "ok" : mine_if_rollout);
  std::string failures;
  for (int r = 0; r < rollout_size(); ++r) {
    const auto v = shared->get_string(key("verdict", std::to_string(r)), options.timeout);
    if (v != "ok") failures += v;
  }
  rollout_finished(key("verdicts_read", ""));
  last_verified = failures.empty();
  return failures;
}

// Each rollout rank marks `phase` done (its last store call in it) and the training ranks wait for
// all of them: a training job that left right after would otherwise cut off a rollout rank still
// waiting for a reply from the store its rank 0 hosts.
void SyncLink::rollout_finished(const std::string& phase) {
  if (!training) return shared->set(phase + std::to_string(rank), "1");
  std::vector<std::string> done;
  for (int r = 0; r < rollout_size(); ++r) done.push_back(phase + std::to_string(r));
  shared->wait(done, options.timeout);
}

std::string SyncLink::key(const std::string& what, const std::string& rest) const {
  return what + "/" + std::to_string(syncs) + "/" + rest;
}

std::vector<transport::RemoteTransfer> SyncLink::batch_skeleton() const {
  std::vector<transport::RemoteTransfer> batch(plans.size());
  for (size_t i = 0; i < plans.size(); ++i) {
    batch[i].plan = &plans[i];
    for (int r = 0; r < train_size(); ++r) batch[i].source_processes.push_back({options.train_job, r});
    for (int r = 0; r < rollout_size(); ++r) batch[i].target_processes.push_back({options.rollout_job, r});
  }
  return batch;
}

}  // namespace tessera
