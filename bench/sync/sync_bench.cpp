// Training -> rollout weight sync against gather-then-broadcast, over the same UCX transport and
// sizes, in one run. Two jobs (start both with run_sync_bench.py): --role train (DP ranks, a ZeRO
// engine over a reduced-width Qwen3-8B-shaped model) and --role rollout (TP ranks).
//   sync:       WeightSender / RolloutSink: each rollout rank receives only its shard, straight
//               from the engine's buffers, planned once; timed with and without its verification.
//   broadcast:  the baseline RL frameworks use: every rollout rank receives every full tensor (the
//               training weights at ZeRO 0-2 are whole on every rank, so the gather is free) into
//               a staging tensor, then cuts its shard out of it (cut_shard); wire = TP x useful.
//   delta:      into a bf16 rollout: full syncs (the baseline), then delta syncs after changing
//               --delta-fraction of every weight's elements; training rank 0 prints wire bytes
//               full / delta, times, and the last-synced copy the delta keeps.
// Rank 0 of the rollout job prints JSON lines: per mode the median time per sync, wire bytes /
// useful bytes, staged bytes; the plan time (once); and the ratio sync / broadcast. Every process
// also prints a "process" line: its bytes and puts per sync and the range of its transfer times
// (the training side also its puts by size, from the same plans the sync replays, and the memcpy
// baseline: the same segments copied by core/affine's local executor from the same engine buffers
// into UCX-allocated memory laid out as the rollout ranks'), its transfer's staging peak, and its
// peak RSS (getrusage ru_maxrss) after the sync phase and at the end; run_sync_bench.py measures
// ucx_perftest at those put sizes and prints every ratio.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/affine/builders.h"
#include "core/affine/local_executor.h"
#include "core/affine/planner.h"
#include "core/config/load.h"
#include "core/affine/replica_policy.h"
#include "core/nn/decoder.h"
#include "core/nn/tp_maps.h"
#include "transport/affine/remote_executor.h"
#include "transport/launch_env.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}
double lowest(const std::vector<double>& v) { return v.empty() ? 0 : *std::min_element(v.begin(), v.end()); }
double highest(const std::vector<double>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); }
std::string json_list(const std::vector<double>& v) {
  std::string out = "[";
  char item[32];
  for (double x : v) std::snprintf(item, sizeof item, "%s%.2f", out.size() > 1 ? "," : "", x), out += item;
  return out + "]";
}

tessera::nn::DecoderConfig bench_config(int hidden, int layers, int vocab) {
  // Qwen3-8B's proportions (36 layers of 4096, 32 heads of 128, 8 KV heads, 12288 MLP, 151936
  // vocabulary) at a reduced width and depth.
  const int heads = std::max(4, hidden / 128), kv = std::max(2, heads / 4);
  const std::string json = R"({"model_type": "qwen3", "vocab_size": )" + std::to_string(vocab) +
                           R"(, "hidden_size": )" + std::to_string(hidden) + R"(, "intermediate_size": )" +
                           std::to_string(3 * hidden) + R"(, "num_hidden_layers": )" + std::to_string(layers) +
                           R"(, "num_attention_heads": )" + std::to_string(heads) + R"(, "num_key_value_heads": )" +
                           std::to_string(kv) + R"(, "head_dim": 128, "tie_word_embeddings": false})";
  return tessera::nn::parse_decoder_config(json, "sync_bench");
}

// This process's peak resident set so far, in KiB (Linux: ru_maxrss is in KiB).
long max_rss_kib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}
// Minor page faults of this process so far (a put into a freshly attached segment faults per page).
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// The puts a RemoteExecutor issues for one segment (transport/affine/remote_executor.cpp) into
// a rollout rank's weights, which are UCX-allocated and so, on one machine, mapped into the
// sender: a segment that is one contiguous run is one put of its bytes; any other (a row-parallel
// shard: rows strided at the source) is copied row by row straight into the mapping, and counts
// here as the one put of its bytes that coalescing it would make (the size ucx_perftest is run at
// for those bytes). Calls f(bytes) per put.
void for_each_put(const tessera::affine::Segment& s, int64_t element_size, int64_t /*staging_bytes*/,
                  const std::function<void(int64_t)>& f) {
  if (s.elements() > 0) f(s.elements() * element_size);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Weight sync vs gather-then-broadcast between a training and a rollout job"};
  std::string role, peer;
  int hidden = 1024, layers = 4, vocab = 16384, repeats = 5, stage = 2;
  app.add_option("--role", role)->required()->check(CLI::IsMember({"train", "rollout"}));
  app.add_option("--peer-job", peer)->required();
  app.add_option("--hidden", hidden);
  app.add_option("--layers", layers);
  app.add_option("--vocab", vocab);
  app.add_option("--repeats", repeats);
  app.add_option("--stage", stage);
  std::string replica_policy = tessera::affine::name_of(tessera::WeightSyncOptions{}.replica_policy);
  app.add_option("--replica-policy", replica_policy, "lowest: training rank 0 sends every weight; balanced: all do")
      ->capture_default_str();
  double delta_fraction = 0.02;
  app.add_option("--delta-fraction", delta_fraction,
                 "delta phase: fraction of each weight's elements changed between syncs (bf16 rollout; 0: skip)");
  CLI11_PARSE(app, argc, argv);
  const auto env = tessera::transport::LaunchEnv::from_env();
  const bool training = role == "train";
  const auto config = bench_config(hidden, layers, vocab);
  tessera::WeightSyncOptions so;
  so.train_job = training ? env.job : peer;
  so.rollout_job = training ? peer : env.job;
  so.session = "bench";
  try {
    so.replica_policy = tessera::affine::replica_policy_kind(replica_policy);
    // The UCX directory of the broadcast baseline (2.), connected first: the memcpy baseline needs
    // the rollout job's size.
    tessera::transport::UcxContext context({});
    tessera::transport::UcxPeers peers(context, tessera::actors::job_store(), env.job, env.rank, env.world_size,
                                       "bench_broadcast");
    const int peer_size = peers.connect(peer);
    const int S = training ? env.world_size : peer_size, T = training ? peer_size : env.world_size;
    // 1. tessera's sync.
    std::unique_ptr<tessera::nn::DecoderLm> model;
    std::shared_ptr<tessera::Engine> engine;
    std::unique_ptr<tessera::RolloutEngine> rollout;
    std::vector<double> sync_ms, verify_ms, transfer_ms;
    double plan_ms = 0, wire = 0;
    int64_t bytes = 0, puts = 0, staging_peak = 0;
    int64_t largest_put = 0, planned_puts = 0;  // training side: from the plans
    std::map<int64_t, int64_t> put_sizes;  // training side: bytes -> puts of that size, from the plans
    std::vector<double> memcpy_ms;          // training side: the like-for-like copy (below)
    int64_t memcpy_bytes = 0;
    long sync_faults = 0, memcpy_faults = 0;  // training side: minor page faults, summed over the repeats
    if (training) {
      model = std::make_unique<tessera::nn::DecoderLm>(config);
      const std::string toml = "train_micro_batch_size_per_gpu = 1\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\n"
                               "lr = 1e-3\n[zero_optimization]\nstage = " + std::to_string(stage) + "\n";
      engine = tessera::initialize(model->module(),
                                   tessera::config::load_config_text(toml, tessera::config::Format::toml, "bench"))
                   .engine;
      tessera::WeightSender sender(*engine, config, so);
      // The puts of this rank, from the plans the sync replays (its source maps, the rollout's TP
      // maps, the same replica policy).
      const auto storage = engine->storage_maps();
      std::map<std::string, const tessera::StoredTensorMap*> sources;
      for (const auto& m : storage.maps)
        if (m.kind == "param") sources[m.map.name] = &m;
      tessera::affine::PlanOptions po;
      po.policy = tessera::affine::parse_replica_policy(replica_policy);  // lowest or balanced (local: no tables here)
      std::vector<tessera::affine::Plan> mine;  // the plans, cut to the segments this rank sources
      std::vector<tessera::affine::TensorMap> targets;
      for (const auto& [name, shape] : tessera::nn::decoder_parameter_shapes(config)) {
        targets.push_back(tessera::nn::decoder_tp_map(config, name, T, tessera::affine::DType::f32));
        auto plan = tessera::affine::plan(targets.back(), sources.at(name)->map, po);
        for (const auto& seg : plan.segments)
          if (seg.source_rank == env.rank)
            for_each_put(seg, 4, so.staging_bytes, [&](int64_t b) { largest_put = std::max(largest_put, b), ++planned_puts, ++put_sizes[b]; });
        plan.segments.erase(std::remove_if(plan.segments.begin(), plan.segments.end(),
                                           [&](const auto& seg) { return seg.source_rank != env.rank; }),
                            plan.segments.end());
        mine.push_back(std::move(plan));
      }
      // The like-for-like baseline of this rank's share of a sync: the same segments copied by
      // memcpy (core/affine's local executor, straight, no staging) from the same engine buffers
      // into UCX-allocated memory laid out as the rollout ranks' (shared memory on one machine,
      // pages touched once beforehand, as the sink's are): what one core can move when a put is
      // nothing but its copy, with neither end cache-resident.
      std::vector<std::map<size_t, int64_t>> offset_in(static_cast<size_t>(T));  // per rollout rank: plan -> element offset
      std::vector<int64_t> elements(size_t(T), 0);
      for (size_t i = 0; i < targets.size(); ++i)
        for (int r = 0; r < T; ++r) {
          offset_in[size_t(r)][i] = elements[size_t(r)];
          elements[size_t(r)] += (targets[i].ranks.at(r).buffer_elements + 15) / 16 * 16;  // 64-byte aligned
        }
      std::vector<std::unique_ptr<tessera::transport::UcxMemory>> regions;
      std::vector<tessera::affine::LocalTransfer> local;
      for (int r = 0; r < T; ++r) {
        regions.push_back(tessera::transport::UcxMemory::allocate(context, size_t(std::max<int64_t>(elements[size_t(r)], 16) * 4)));
        std::memset(regions.back()->address(), 0, regions.back()->bytes());
      }
      for (size_t i = 0; i < mine.size(); ++i) {
        tessera::affine::LocalTransfer t;
        t.plan = &mine[i];
        const auto& source = *sources.at(mine[i].name);
        auto& flat = storage.buffers.at(source.buffer);
        t.source_buffers[env.rank] = {flat.data_ptr(), flat.numel(), tessera::affine::DType::f32};
        for (int r = 0; r < T; ++r)
          t.target_buffers[r] = {static_cast<float*>(regions[size_t(r)]->address()) + offset_in[size_t(r)][i],
                                 targets[i].ranks.at(r).buffer_elements, tessera::affine::DType::f32};
        local.push_back(std::move(t));
      }
      // Each sync is followed by one memcpy of the same segments (the rollout ranks wait for the
      // next sync meanwhile), so both see the same load on these shared cores.
      tessera::affine::LocalExecutorOptions lo;
      lo.staging_bytes = so.staging_bytes;
      for (int i = 0; i < repeats + 1; ++i) {
        const long f0 = minor_faults();
        const auto s = sender.sync();
        staging_peak = std::max(staging_peak, s.staging_peak_bytes);
        const long f1 = minor_faults();
        const auto t = Clock::now();
        memcpy_bytes = tessera::affine::execute_local(local, lo).bytes_copied;
        if (i == 0) continue;
        sync_faults += f1 - f0, memcpy_faults += minor_faults() - f1;
        memcpy_ms.push_back(ms_since(t));
        transfer_ms.push_back(s.sync_ms);
        bytes = s.bytes_sent, puts = s.puts;
      }
    } else {
      const auto dir = std::filesystem::temp_directory_path() / ("tessera_sync_bench_" + std::to_string(::getppid()) + "_" +
                                                                 std::to_string(env.rank));
      std::filesystem::create_directories(dir);
      std::ofstream(dir / "config.json") << tessera::nn::decoder_config_json(config);
      tessera::RolloutOptions ro;
      ro.config_path = (dir / "config.json").string();
      rollout = tessera::RolloutEngine::create(ro);
      std::filesystem::remove_all(dir);
      tessera::RolloutSink sink(*rollout, so);
      for (int i = 0; i < repeats + 1; ++i) {
        const auto s = sink.receive();
        if (i == 0) {
          plan_ms = s.plan_ms;
          continue;  // the first one registers memory and connects
        }
        sync_ms.push_back(s.sync_ms + s.verify_ms);
        verify_ms.push_back(s.verify_ms);
        transfer_ms.push_back(s.sync_ms);
        wire = s.wire_to_useful, bytes = s.bytes_sent, puts = s.puts;
        staging_peak = std::max(staging_peak, s.staging_peak_bytes);
      }
    }
    const long rss_after_sync_kib = max_rss_kib();

    // 2. gather-then-broadcast over the same executor: every rollout rank receives whole tensors.
    tessera::transport::RemoteExecutor executor(peers, "bench_broadcast");
    std::vector<tessera::affine::Plan> plans;
    const auto shapes = tessera::nn::decoder_parameter_shapes(config);
    for (const auto& [name, shape] : shapes) {
      const tessera::affine::TensorInfo info{name, tessera::affine::DType::f32, tessera::affine::Dims(shape)};
      plans.push_back(tessera::affine::plan(tessera::affine::replicated(info, T), tessera::affine::replicated(info, S)));
    }
    std::vector<torch::Tensor> staging;  // rollout: one whole tensor per parameter
    auto params = training ? model->module()->named_parameters() : rollout->model().module()->named_parameters();
    // The baseline's receive buffers live in UCX-allocated memory, as the sink's weights do (so
    // both land puts in shared memory on one machine: the same transport, the same advantage).
    std::shared_ptr<tessera::transport::UcxMemory> staging_memory;
    if (!training) {
      int64_t total = 0;
      for (const auto& [name, shape] : shapes) total += tessera::affine::Dims(shape).product() * 4;
      staging_memory = tessera::transport::UcxMemory::allocate(context, size_t(total));
      executor.use_registered(staging_memory);
      auto* base = static_cast<float*>(staging_memory->address());
      for (const auto& [name, shape] : shapes) {
        staging.push_back(torch::from_blob(base, shape, torch::kFloat));
        base += tessera::affine::Dims(shape).product();
      }
    }
    std::vector<double> broadcast_ms;
    int64_t broadcast_bytes = 0;
    for (int i = 0; i < repeats + 1; ++i) {
      std::vector<tessera::transport::RemoteTransfer> batch(plans.size());
      for (size_t k = 0; k < plans.size(); ++k) {
        batch[k].plan = &plans[k];
        for (int r = 0; r < S; ++r) batch[k].source_processes.push_back({so.train_job, r});
        for (int r = 0; r < T; ++r) batch[k].target_processes.push_back({so.rollout_job, r});
        if (training) {
          auto p = params[shapes[k].first];
          batch[k].source_buffers[env.rank] = {p.data_ptr(), p.numel(), tessera::affine::DType::f32};
        } else {
          batch[k].target_buffers[env.rank] = {staging[k].data_ptr(), staging[k].numel(), tessera::affine::DType::f32};
        }
      }
      const auto t = Clock::now();
      const auto s = executor.execute(batch);
      if (!training) {
        torch::NoGradGuard no_grad;
        for (size_t k = 0; k < plans.size(); ++k)
          params[shapes[k].first].copy_(tessera::nn::cut_shard(
              staging[k], tessera::nn::decoder_tp_shard(config, shapes[k].first, env.rank, env.world_size)));
        // Every rank holds its cut: wait for all of them, as a sync does.
        auto store = tessera::actors::job_store();
        store->set("broadcast_done/" + std::to_string(i) + "/" + std::to_string(env.rank), "1");
        std::vector<std::string> keys;
        for (int r = 0; r < env.world_size; ++r) keys.push_back("broadcast_done/" + std::to_string(i) + "/" + std::to_string(r));
        store->wait(keys);
      }
      if (i > 0) broadcast_ms.push_back(ms_since(t));
      broadcast_bytes = s.bytes_received + s.bytes_copied_locally;
    }
    if (!training && env.rank == 0) {
      const int64_t params_count = tessera::nn::decoder_parameter_count(config);
      std::printf("{\"bench\":\"weight_sync\",\"mode\":\"sync\",\"train_ranks\":%d,\"rollout_ranks\":%d,\"parameters\":%lld,"
                  "\"bytes\":%lld,\"ms\":%.2f,\"transfer_ms\":%.2f,\"transfer_ms_min\":%.2f,\"transfer_ms_max\":%.2f,\"transfer_ms_each\":%s,\"verify_ms\":%.2f,\"wire_to_useful\":%.3f,"
                  "\"plan_ms_once\":%.2f,\"replica_policy\":\"%s\",\"ucx_tls\":\"%s\"}\n",
                  S, T, static_cast<long long>(params_count), static_cast<long long>(params_count * 4), median(sync_ms),
                  median(transfer_ms), lowest(transfer_ms), highest(transfer_ms), json_list(transfer_ms).c_str(), median(verify_ms), wire, plan_ms, replica_policy.c_str(),
                  std::getenv("UCX_TLS") ? std::getenv("UCX_TLS") : "(default)");
      std::printf("{\"bench\":\"weight_sync\",\"mode\":\"gather_broadcast\",\"train_ranks\":%d,\"rollout_ranks\":%d,"
                  "\"ms\":%.2f,\"wire_to_useful\":%.3f}\n",
                  S, T, median(broadcast_ms), bytes > 0 ? double(broadcast_bytes) / double(bytes) : 0.0);
      std::printf("{\"bench\":\"weight_sync\",\"ratio_sync_to_gather_broadcast\":%.3f,\"rank0_bytes_received\":%lld}\n",
                  median(sync_ms) / median(broadcast_ms), static_cast<long long>(bytes));
    }
    // 3. Delta syncs into a bf16 rollout (the common case: fp32 training, cast on the way) when a
    // fraction of the elements changed: the first sync is full, the next ones send deltas.
    if (delta_fraction > 0) {
      tessera::WeightSyncOptions d = so;
      d.session = "bench_delta";
      d.delta = true;
      tessera::WeightSyncOptions f = so;  // the same, full every time: the baseline
      f.session = "bench_bf16_full";
      std::vector<double> delta_ms, pack_ms, full_runs;
      double full_ms = 0;
      int64_t full_wire = 0, delta_wire = 0, changed = 0, full_bytes = 0, base_bytes = 0, mirror_bytes = 0;
      if (training) {
        {
          tessera::WeightSender full(*engine, config, f);
          for (int i = 0; i < repeats + 1; ++i) {
            const auto s = full.sync();
            if (i > 0) full_runs.push_back(s.cast_ms + s.sync_ms + s.verify_ms);
            full_wire = s.bytes_sent;
          }
          full_ms = median(full_runs);
        }
        tessera::WeightSender sender(*engine, config, d);
        sender.sync();  // the first is full
        for (int i = 0; i < repeats; ++i) {
          {  // change `delta_fraction` of every weight's elements by 5% (enough to change their bf16 bits)
            torch::NoGradGuard no_grad;
            auto g = at::detail::createCPUGenerator(uint64_t(77 + i));
            for (auto& p : model->module()->parameters()) {
              auto flat = p.view({-1});
              const auto picked = torch::rand({flat.numel()}, g) < delta_fraction;
              flat.copy_(torch::where(picked, flat * 1.05f + 1e-3f, flat));  // the rest keep their bits
            }
          }
          const auto s = sender.sync();
          delta_ms.push_back(s.cast_ms + s.pack_ms + s.sync_ms + s.verify_ms), pack_ms.push_back(s.pack_ms);
          delta_wire = s.bytes_sent, changed = s.changed_elements, full_bytes = s.full_bytes;
          base_bytes = s.delta_base_bytes, mirror_bytes = s.cast_mirror_bytes;
          if (!s.delta) throw tessera::Error("the delta phase's sync " + std::to_string(i + 1) + " was not a delta");
        }
        if (env.rank == 0)
          std::printf("{\"bench\":\"weight_sync\",\"mode\":\"delta\",\"rollout_dtype\":\"bf16\",\"changed_fraction\":%.3f,"
                      "\"changed_elements\":%lld,\"full_wire_bytes\":%lld,\"delta_wire_bytes\":%lld,"
                      "\"wire_ratio_full_to_delta\":%.2f,\"full_ms\":%.2f,\"delta_ms\":%.2f,\"pack_ms\":%.2f,"
                      "\"delta_base_bytes\":%lld,\"cast_mirror_bytes\":%lld,\"full_bytes_of_packed\":%lld}\n",
                      delta_fraction, static_cast<long long>(changed), static_cast<long long>(full_wire),
                      static_cast<long long>(delta_wire), delta_wire > 0 ? double(full_wire) / double(delta_wire) : 0.0,
                      full_ms, median(delta_ms), median(pack_ms), static_cast<long long>(base_bytes),
                      static_cast<long long>(mirror_bytes), static_cast<long long>(full_bytes));
      } else {
        const auto dir = std::filesystem::temp_directory_path() /
                         ("tessera_sync_bench_delta_" + std::to_string(::getppid()) + "_" + std::to_string(env.rank));
        std::filesystem::create_directories(dir);
        std::ofstream(dir / "config.json") << tessera::nn::decoder_config_json(config);
        tessera::RolloutOptions ro;
        ro.config_path = (dir / "config.json").string();
        ro.dtype = at::kBFloat16;
        auto bf16 = tessera::RolloutEngine::create(ro);
        std::filesystem::remove_all(dir);
        {
          tessera::RolloutSink full(*bf16, f);
          for (int i = 0; i < repeats + 1; ++i) full.receive();
        }
        tessera::RolloutSink sink(*bf16, d);
        sink.receive();
        for (int i = 0; i < repeats; ++i) sink.receive();
      }
    }
    // Every process: what it moved per sync (the training side: its puts by size, from the plans,
    // and the memcpy of the same segments), its staging peak and its peak RSS.
    std::string sizes_json = "[";
    for (const auto& [b, n] : put_sizes)
      sizes_json += (sizes_json.size() > 1 ? "," : "") + std::string("[") + std::to_string(b) + "," + std::to_string(n) + "]";
    sizes_json += "]";
    std::printf("{\"bench\":\"weight_sync\",\"mode\":\"process\",\"role\":\"%s\",\"rank\":%d,\"%s\":%lld,"
                "\"puts\":%lld,\"avg_put_bytes\":%.0f,\"largest_put_bytes\":%lld,\"planned_puts\":%lld,"
                "\"put_sizes\":%s,\"transfer_ms\":%.2f,\"transfer_ms_min\":%.2f,\"transfer_ms_max\":%.2f,\"transfer_ms_each\":%s,"
                "\"memcpy_bytes\":%lld,\"memcpy_ms\":%.2f,\"memcpy_ms_min\":%.2f,\"memcpy_ms_max\":%.2f,\"memcpy_ms_each\":%s,\"faults_per_sync\":%.0f,\"faults_per_memcpy\":%.0f,"
                "\"staging_peak_bytes\":%lld,\"staging_bytes\":%lld,"
                "\"max_rss_kib_after_sync\":%ld,\"max_rss_kib\":%ld}\n",
                role.c_str(), env.rank, training ? "bytes_sent" : "bytes_received", static_cast<long long>(bytes),
                static_cast<long long>(puts), puts > 0 ? double(bytes) / double(puts) : 0.0,
                static_cast<long long>(largest_put), static_cast<long long>(planned_puts), sizes_json.c_str(),
                median(transfer_ms), lowest(transfer_ms), highest(transfer_ms), json_list(transfer_ms).c_str(),
                static_cast<long long>(memcpy_bytes),
                median(memcpy_ms), lowest(memcpy_ms), highest(memcpy_ms), json_list(memcpy_ms).c_str(), double(sync_faults) / std::max(1, repeats),
                double(memcpy_faults) / std::max(1, repeats), static_cast<long long>(staging_peak),
                static_cast<long long>(so.staging_bytes), rss_after_sync_kib, max_rss_kib());
    std::fflush(stdout);
    // The training job hosts the store: it stays until every rollout rank is done with it.
    auto shared = tessera::actors::job_store()->shared("bench_exit");
    if (!training) shared->set("rollout/" + std::to_string(env.rank), "1");
    std::vector<std::string> keys;
    for (int r = 0; r < (training ? peer_size : env.world_size); ++r) keys.push_back("rollout/" + std::to_string(r));
    if (training || env.rank == 0) shared->wait(keys);
    if (!training && env.rank == 0) shared->set("done", "1");
    if (training) shared->get("done");
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "sync_bench %s (rank %d): %s\n", role.c_str(), env.rank, e.what());
    return 1;
  }
  return 0;
}
