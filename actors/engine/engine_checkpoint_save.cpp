// Engine::save_checkpoint, on the user's thread: checks, agreement on the tag and the partial
// directory (rank 0's nonce), and a SaveJob (checkpoint_save_job.h) holding what this rank writes:
// views of its buffers, run at once (synchronous), or sent with those views to the checkpoint
// writer (asynchronous; checkpoint_writer.h), which snapshots them into its staging area while the
// next forward and backward run, then writes and commits. A save, a load and the engine's
// destruction wait for the asynchronous save in flight; whatever changes stored state waits for
// its snapshot (Engine::Impl::wait_for_snapshot).
#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "actors/actor_runtime.h"
#include "actors/ask.h"
#include "actors/engine/checkpoint_save_job.h"
#include "actors/engine/checkpoint_support.h"
#include "actors/engine/engine_impl.h"
#include "actors/engine/sigterm_flag.h"
#include "core/affine/serialize.h"
#include "core/checkpoint/checkpoint_dir.h"
#include "core/config/write.h"
#include "core/log/log.h"
#include "transport/communicator.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

using nlohmann::json;
using namespace checkpoint_support;

checkpoint::EngineCounters counters(const Engine::Impl& s, int64_t optimizer_updates) {
  checkpoint::EngineCounters c;
  c.global_steps = s.global, c.skipped_steps = s.skipped, c.micro_steps = s.micro->micro();
  c.optimizer_updates = optimizer_updates;
  for (const auto& g : s.groups) c.group_lrs.push_back(g.options.lr);
  c.last_lrs = s.last_lrs;
  if (s.scaler) {
    c.has_loss_scaler = true;
    c.loss_scaler = s.scaler->snapshot();
  }
  return c;
}

void check_can_save(const Engine::Impl& s, const std::string& client_state) {
  for (const auto& g : s.groups)
    if (g.client_step)
      throw CheckpointError("save_checkpoint: the client optimizer (" + g.client_class +
                            ") keeps its own state outside tessera's buffers; checkpoints of client optimizers tessera "
                            "does not translate are not supported yet (use Adam, AdamW, SGD or Adagrad, or the config's "
                            "optimizer)");
  if (!s.micro->at_batch_start())
    throw CheckpointError("save_checkpoint: called inside a batch (micro-step " + std::to_string(s.micro->micro()) +
                          "): save after step() at an accumulation boundary, before the next backward");
  json client;
  try {
    client = json::parse(client_state);
  } catch (const std::exception& e) {
    throw CheckpointError(std::string("save_checkpoint: client_state is not JSON: ") + e.what());
  }
  if (!client.is_object()) throw CheckpointError("save_checkpoint: client_state must be a JSON object");
}

// Every rank saves one tag into one partial directory: rank 0 clears leftovers and picks it. Ranks
// that pass different tags (DeepSpeed's `checkpoint.tag_validation`): fail refuses on every rank
// before anything is written; warn and ignore save under rank 0's tag, warn saying which ranks
// differed. Returns the tag and the partial directory.
struct AgreedSave {
  std::string tag, partial;
};

AgreedSave agree_on_partial(transport::Communicator* comm, int rank, const std::string& dir, const std::string& tag,
                            bool async, config::TagValidation validation, const checkpoint::BackgroundRemoval& removal) {
  std::string error;
  if (rank == 0) {
    try {
      fs::create_directories(dir);
      checkpoint::remove_partials(dir, removal.pending());
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const auto hello =
      all_gather_strings(comm, json{{"tag", tag}, {"nonce", nonce()}, {"async", async}, {"error", error}}.dump());
  const auto first = json::parse(hello[0]);
  const std::string agreed = first["tag"].get<std::string>();
  std::vector<std::string> errors;
  std::string tags = "rank 0 '" + agreed + "'";  // and every rank whose tag differs
  bool differ = false;
  for (size_t r = 0; r < hello.size(); ++r) {
    const auto h = json::parse(hello[r]);
    errors.push_back(h["error"].get<std::string>());
    if (h["async"] != first["async"] && errors.back().empty())  // the writer's collectives need every rank
      errors.back() = "rank " + std::to_string(r) + " saves " + (h["async"].get<bool>() ? "asynchronously" : "synchronously") +
                      ", rank 0 " + (first["async"].get<bool>() ? "asynchronously" : "synchronously") +
                      " (SaveMode, or [tessera.checkpoint] async_save, must agree)";
    if (h["tag"] == agreed) continue;
    differ = true;
    tags += ", rank " + std::to_string(r) + " '" + h["tag"].get<std::string>() + "'";
  }
  if (auto e = first_error(errors); !e.empty()) throw CheckpointError("save_checkpoint " + dir + ": " + e);
  if (differ && validation == config::TagValidation::fail)  // every rank read the same tags: all refuse
    throw CheckpointError("save_checkpoint " + dir + ": the ranks pass different tags (" + tags +
                          "; checkpoint.tag_validation is Fail)");
  if (differ && validation == config::TagValidation::warn && rank == 0)
    log::warn("save_checkpoint " + dir + ": the ranks pass different tags (" + tags + "); saving under rank 0's '" +
              agreed + "' (checkpoint.tag_validation: Warn; Fail refuses, Ignore says nothing)");
  return {agreed, checkpoint::partial_dir(dir, agreed, first["nonce"].get<std::string>())};
}

}  // namespace

std::string Engine::save_checkpoint(const std::string& dir, const CheckpointSaveOptions& options) {
  auto& s = *impl_;
  s.rethrow_pending();
  s.require_resident("save_checkpoint");
  s.refuse_during_update("save_checkpoint");
  wait_for_checkpoint();
  check_can_save(s, options.client_state);
  const std::string requested = options.tag.empty() ? "global_step" + std::to_string(s.global) : options.tag;
  checkpoint::check_tag(requested);
  const bool async = options.mode == SaveMode::asynchronous ||
                     (options.mode == SaveMode::configured && s.config.tessera.checkpoint.async_save);
  auto* comm = s.control_comm();

  const auto agreed =
      agree_on_partial(comm, s.spec->rank, dir, requested, async, s.config.checkpoint.tag_validation, *s.removal);
  const std::string& tag = agreed.tag;
  SaveJob job;
  job.dir = dir, job.tag = tag, job.rank = s.spec->rank, job.world = s.spec->world;
  job.partial = agreed.partial;
  job.save_latest = options.save_latest;
  job.keep_last = s.config.tessera.checkpoint.keep_last;
  job.at_point_for_testing = options.at_point_for_testing;
  job.removal = s.removal;
  const auto storage = storage_maps();
  job.maps = engine_maps(storage);
  job.aliases = find_aliases(storage);
  const checkpoint::SaveLayout layout(job.maps, job.world);
  if (async && !s.writer) s.writer = std::make_unique<CheckpointWriter>(s.new_communicator(".ckptw"));
  std::vector<SnapshotSource> sources;  // asynchronous: what the writer copies, and what must not change meanwhile
  std::vector<WatchedTensor> watched;
  auto add = [&](const std::string& key, const at::Tensor& view) {
    if (!async) return job.tensors.push_back({key, view});
    sources.push_back({key, view});
    watched.push_back(WatchedTensor::of("buffer '" + key + "'", view));
  };
  // Below ZeRO-3 the module's parameters are views of the weight buffers with counters of their own
  // (at ZeRO-3 they are gathered copies: changes to them reach nothing saved).
  if (async && !s.stage3)
    for (const auto& item : s.module->named_parameters())
      watched.push_back(WatchedTensor::of("parameter '" + item.key() + "'", item.value()));
  for (const auto& [key, t] : storage.buffers) {
    if (!t.defined()) continue;
    const auto range = layout.written_range(job.rank, key, t.numel(), job.aliases);
    if (!range) continue;
    add(key, t.reshape({t.numel()}).narrow(0, range->first, range->second - range->first));
  }
  // Frozen parameters, whole, in rank 0's file (every rank holds them alike).
  auto& m = job.manifest;
  const auto frozen = frozen_parameters(*s.module, s.names);
  for (size_t i = 0; i < frozen.size(); ++i) {
    const auto& [name, p] = frozen[i];
    const std::string key = "frozen/" + std::to_string(i);
    m.frozen.push_back({name, affine_dtype(p.scalar_type()), affine::Dims(p.sizes().vec()), 0, key});
    if (job.rank != 0) continue;
    add(key, p.detach().contiguous().reshape({p.numel()}));
  }
  // What rank 0's manifest says besides the files and their maps.
  m.tag = tag, m.world_size = job.world, m.stage = int(s.settings.stage);
  m.dtype = affine::dtype_name(affine_dtype(s.spec->dtype));
  auto params = s.module->named_parameters();
  for (const auto& name : s.names) {
    const auto& p = params[name];
    m.parameters.push_back({name, affine_dtype(p.scalar_type()), affine::Dims(p.sizes().vec())});
  }
  for (const auto& map : job.maps)
    if (std::find(m.kinds.begin(), m.kinds.end(), map.kind) == m.kinds.end()) m.kinds.push_back(map.kind);
  const auto optimizer = s.inference ? actors::OptimizerStates{}
                                     : actors::checked(actors::ask<actors::OptimizerStates>(
                                           s.optimizer_shard, s.bound(), "save_checkpoint: the optimizer-shard", actors::states_atom::value));
  m.engine = counters(s, optimizer.updates);
  m.client_state = json::parse(options.client_state).dump();
  m.config = config::to_json(s.config);

  const auto path = (fs::path(dir) / tag).string();
  if (!async) return run_save_job(job, comm);
  s.writer->submit(std::move(job), std::move(sources), std::move(watched));
  // With parameters or optimizer states on NVMe, storage_maps() paged them in and lent them until
  // the next gather or step, which may reuse those buffers: the snapshot is taken now.
  if (s.spec->weight_home == zero::WeightHome::nvme || s.spec->optimizer_offload.placement == actors::StatePlacement::nvme)
    s.writer->wait_for_snapshot();
  return path;
}

void Engine::wait_for_checkpoint() {
  if (impl_->writer) impl_->writer->wait();
}

int64_t Engine::checkpoint_staging_bytes() const {
  if (!impl_->writer) return 0;
  impl_->writer->wait_for_snapshot();  // the staging area is (re)sized by the snapshot
  return impl_->writer->staging_bytes();
}

double Engine::Impl::wait_for_snapshot() const { return writer ? writer->wait_for_snapshot() : 0; }

std::shared_ptr<transport::Communicator> Engine::Impl::new_communicator(const std::string& suffix) {
  if (spec->world == 1) return nullptr;
  if (world) {
    std::vector<int> all(size_t(world->size()));
    for (int r = 0; r < world->size(); ++r) all[size_t(r)] = r;
    return world->group(all, comm_name + suffix, spec->timeout);
  }
  transport::CommunicatorOptions options;
  options.timeout = spec->timeout;
  options.name = comm_name + suffix;
  return transport::Communicator::gloo(actors::job_store(), spec->rank, spec->world, options);
}

transport::Communicator* Engine::Impl::control_comm() {
  if (!control) control = new_communicator(".ckpt");
  return control.get();
}

}  // namespace tessera

namespace tessera {

void Engine::save_and_exit_after_sigterm() {
  auto& s = *impl_;
  auto* comm = s.control_comm();
  auto flag = at::full({1}, sigterm_received() ? 1 : 0, at::kInt);
  transport::ReduceOptions max;
  max.op = transport::ReduceOp::max;
  if (comm) comm->all_reduce(flag, max)->wait();  // any rank's SIGTERM is every rank's
  if (flag.item<int>() == 0) return;
  const auto& dir = s.config.tessera.checkpoint.sigterm_save_dir;
  CheckpointSaveOptions options;
  options.mode = SaveMode::synchronous;
  const auto path = save_checkpoint(dir, options);
  if (s.spec->rank == 0) log::warn("SIGTERM: saved checkpoint " + path + " at step " + std::to_string(s.global) + "; exiting");
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);  // the checkpoint is synced; destructors of actors and sockets are not needed to keep it
}

}  // namespace tessera
