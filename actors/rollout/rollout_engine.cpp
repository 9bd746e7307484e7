#include "actors/rollout/rollout_engine.h"

#include <torch/torch.h>

#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "actors/actor_runtime.h"
#include "core/error.h"
#include "core/io/weight_directory.h"
#include "transport/communicator.h"
#include "transport/launch_env.h"

namespace tessera {
namespace {

// The request as int64 words: params, then the prompts' lengths, then their tokens.
std::vector<int64_t> encode(const std::vector<std::vector<int64_t>>& prompts, const nn::SamplingParams& p, bool cache) {
  auto bits = [](double d) {
    int64_t v;
    std::memcpy(&v, &d, sizeof v);
    return v;
  };
  std::vector<int64_t> w = {bits(p.temperature), p.top_k, bits(p.top_p), p.max_new_tokens, p.ignore_eos ? 1 : 0,
                            int64_t(p.seed), cache ? 1 : 0, int64_t(p.stop_token_ids.size())};
  w.insert(w.end(), p.stop_token_ids.begin(), p.stop_token_ids.end());
  w.push_back(int64_t(prompts.size()));
  for (const auto& prompt : prompts) w.push_back(int64_t(prompt.size()));
  for (const auto& prompt : prompts) w.insert(w.end(), prompt.begin(), prompt.end());
  return w;
}

void decode(const std::vector<int64_t>& w, std::vector<std::vector<int64_t>>& prompts, nn::SamplingParams& p,
            bool& cache) {
  size_t at = 0;
  auto real = [&] {
    double d;
    std::memcpy(&d, &w[at++], sizeof d);
    return d;
  };
  p.temperature = real();
  p.top_k = w[at++];
  p.top_p = real();
  p.max_new_tokens = w[at++];
  p.ignore_eos = w[at++] != 0;
  p.seed = uint64_t(w[at++]);
  cache = w[at++] != 0;
  p.stop_token_ids.assign(w.begin() + long(at) + 1, w.begin() + long(at) + 1 + w[at]);
  at += 1 + size_t(w[at]);
  prompts.assign(size_t(w[at++]), {});
  size_t token = at + prompts.size();
  for (auto& prompt : prompts) {
    const auto n = size_t(w[at++]);
    prompt.assign(w.begin() + long(token), w.begin() + long(token + n));
    token += n;
  }
}

}  // namespace

// The published weights (rollout_engine.h says which thread writes and reads what): every field
// is read and written under `mutex`, the one lock for all of them, so a version, its torn flag and
// the staged set's version are always read together. The standby slot is idle (nobody holds it),
// writing (lent to the sink) or staged (a verified set awaits its swap); `changed` wakes its waiters.
struct RolloutEngine::Weights {
  enum class Slot { idle, writing, staged };
  mutable std::mutex mutex;
  std::condition_variable changed;
  uint64_t version = 0;  // 0: none yet, or a load failed after writing began
  bool torn = false;     // an in-place sync failed after it was agreed
  Slot slot = Slot::idle;
  std::vector<torch::Tensor> standby;  // shaped as the parameters, in their order
};

std::unique_ptr<RolloutEngine> RolloutEngine::create(const RolloutOptions& options) {
  if (options.model_dir.empty() && options.config_path.empty())
    throw ConfigError("RolloutEngine: give model_dir (config + weights) or config_path");
  const auto config = nn::load_decoder_config(options.config_path.empty() ? options.model_dir : options.config_path);
  auto group = options.group;
  int rank = 0, size = 1;
  if (group) {
    rank = group->rank(), size = group->size();
  } else {
    const auto env = transport::LaunchEnv::from_env();
    rank = env.rank, size = env.world_size;
  }
  nn::check_tp_size(config, size);  // before anyone connects: every rank fails alike
  // The weights' headers against the config, before the model is allocated: a config.json far
  // bigger than its weights is an error naming the tensor, not an allocator failure.
  // load_weights opens the directory again (headers only) and agrees on the outcome across ranks.
  if (!options.model_dir.empty()) nn::check_decoder_weights(config, io::WeightDirectory(options.model_dir));
  if (!group && size > 1) {
    transport::CommunicatorOptions co;
    co.name = actors::next_communicator_name("rollout") + ".tp";
    co.timeout = options.timeout;
    group = transport::Communicator::gloo(actors::job_store(), rank, size, co);
    group->barrier()->wait();
  }
  std::unique_ptr<RolloutEngine> engine(new RolloutEngine());
  engine->group_ = group;
  engine->timeout_ = options.timeout;
  engine->weights_ = std::make_unique<Weights>();
  nn::DecoderOptions model_options;
  model_options.dtype = options.dtype;
  model_options.random_init = false;  // generate() refuses until weights are loaded or synced
  model_options.tp.rank = rank, model_options.tp.size = size;
  if (size > 1) {
    auto comm = group;
    model_options.tp.all_reduce_sum = [comm](at::Tensor& t) { comm->all_reduce(t.view({-1}))->wait(); };
    model_options.tp.all_gather = [comm](const at::Tensor& t) {
      auto out = torch::empty({comm->size() * t.numel()}, t.options());
      comm->all_gather(t.reshape({-1}), out)->wait();
      return out;
    };
    model_options.tp.broadcast = [comm](at::Tensor& t) { comm->broadcast(t.view({-1}), 0)->wait(); };
  }
  engine->model_ = std::make_unique<nn::DecoderLm>(config, model_options);
  if (!options.model_dir.empty()) engine->load_weights(options.model_dir);
  return engine;
}

RolloutEngine::~RolloutEngine() = default;

uint64_t RolloutEngine::weight_version() const {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  return weights_->version;
}

bool RolloutEngine::weights_torn() const {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  return weights_->torn;
}

void RolloutEngine::mark_weights_torn() {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  weights_->torn = true;
}

void RolloutEngine::unmark_weights_torn() {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  weights_->torn = false;
}

uint64_t RolloutEngine::publish_synced_weights() {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  weights_->torn = false;
  return ++weights_->version;
}

std::vector<at::Tensor> RolloutEngine::standby_for_writing(std::chrono::milliseconds timeout) {
  auto& w = *weights_;
  std::unique_lock<std::mutex> lock(w.mutex);
  if (!w.changed.wait_for(lock, timeout, [&] { return w.slot == Weights::Slot::idle; }))
    throw TimeoutError("RolloutEngine: the staged weights (version " + std::to_string(w.version + 1) +
                       ") were not swapped in within " + std::to_string(timeout.count()) +
                       " ms (double-buffered weights become live at the next generate())");
  if (w.standby.empty()) {
    torch::NoGradGuard no_grad;
    for (const auto& p : model_->module()->parameters()) w.standby.push_back(p.detach().clone());
  }
  w.slot = Weights::Slot::writing;
  return {w.standby.begin(), w.standby.end()};
}

void RolloutEngine::adopt_standby(std::vector<at::Tensor> tensors) {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  auto params = model_->module()->parameters();
  if (weights_->slot != Weights::Slot::idle || tensors.size() != params.size())
    throw Error("RolloutEngine::adopt_standby: the standby set is in use, or " + std::to_string(tensors.size()) +
                " tensors for " + std::to_string(params.size()) + " parameters");
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!tensors[i].sizes().equals(params[i].sizes()) || tensors[i].scalar_type() != params[i].scalar_type())
      throw Error("RolloutEngine::adopt_standby: tensor " + std::to_string(i) + " is not shaped as its parameter");
    tensors[i].copy_(params[i].detach());
  }
  weights_->standby.assign(tensors.begin(), tensors.end());
}

uint64_t RolloutEngine::standby_written(bool verified) {
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lock(weights_->mutex);
    weights_->slot = verified ? Weights::Slot::staged : Weights::Slot::idle;
    if (verified) version = weights_->version + 1;
  }
  weights_->changed.notify_all();
  return version;
}

uint64_t RolloutEngine::staged_version() const {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  return weights_->slot == Weights::Slot::staged ? weights_->version + 1 : 0;
}

bool RolloutEngine::take_staged(bool wait, std::chrono::milliseconds timeout) {
  const auto t = std::chrono::steady_clock::now();
  auto& w = *weights_;
  std::unique_lock<std::mutex> lock(w.mutex);
  if (wait) {
    if (!w.changed.wait_for(lock, timeout, [&] { return w.slot == Weights::Slot::staged; }))
      throw TimeoutError("RolloutEngine::generate: TP rank 0 swaps in version " + std::to_string(w.version + 1) +
                         ", which TP rank " + std::to_string(tp_rank()) + " has not staged within " +
                         std::to_string(timeout.count()) + " ms");
  } else if (w.slot != Weights::Slot::staged) {
    return false;
  }
  {
    torch::NoGradGuard no_grad;
    auto params = model_->module()->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto live = params[i].data();
      params[i].set_data(w.standby[i]);
      w.standby[i] = live;
    }
  }
  w.slot = Weights::Slot::idle;
  ++w.version;
  w.torn = false;
  lock.unlock();
  w.changed.notify_all();
  last_swap_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
  return true;
}

int RolloutEngine::tp_rank() const { return model_->tp().rank; }
int RolloutEngine::tp_size() const { return model_->tp().size; }

void RolloutEngine::load_weights(const std::string& dir) {
  // Every rank loads its shards; all of them agree on the outcome before the version moves, so
  // no rank serves weights another failed to load.
  std::string error;
  bool written = false;
  try {
    io::WeightDirectory weights(dir);
    model_->check_weights(weights);
    written = true;  // from here a failure may leave parameters partly written
    model_->load(weights);
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (group_) {
    auto failed = torch::tensor({error.empty() ? 0.0f : 1.0f, written && !error.empty() ? 1.0f : 0.0f});
    transport::ReduceOptions any;
    any.op = transport::ReduceOp::max;
    group_->all_reduce(failed, any)->wait();
    if (failed[0].item<float>() > 0) {
      if (failed[1].item<float>() > 0) drop_weights();  // some rank may hold a torn mix: serve nothing
      throw CheckpointError(error.empty() ? "RolloutEngine::load_weights: " + dir + ": another TP rank failed to load"
                                          : error);
    }
  } else if (!error.empty()) {
    if (written) drop_weights();
    throw CheckpointError(error);
  }
  publish_synced_weights();  // a complete load publishes as a complete sync does
}

void RolloutEngine::drop_weights() {
  std::lock_guard<std::mutex> lock(weights_->mutex);
  weights_->version = 0;
}

nn::GenerationResult RolloutEngine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                             const nn::SamplingParams& params, bool use_kv_cache) {
  // Rank 0's request, everywhere (its length, then its words); its last word says whether to swap
  // in the staged weights, and then every rank does. The checks come after it: every rank has the
  // same versions then, so all refuse alike and no rank is left in a collective.
  std::vector<std::vector<int64_t>> shared_prompts = prompts;
  nn::SamplingParams shared_params = params;
  bool shared_cache = use_kv_cache;
  if (!group_) {
    take_staged(false, {});
  } else {
    std::vector<int64_t> words;
    if (group_->rank() == 0) {
      words = encode(prompts, params, use_kv_cache);
      words.push_back(staged_version() != 0 ? 1 : 0);
    }
    auto length = torch::tensor({int64_t(words.size())}, torch::kLong);
    group_->broadcast(length, 0)->wait();
    auto buffer =
        group_->rank() == 0 ? torch::tensor(words, torch::kLong) : torch::empty({length.item<int64_t>()}, torch::kLong);
    group_->broadcast(buffer, 0)->wait();
    const int64_t* w = buffer.data_ptr<int64_t>();
    if (w[buffer.numel() - 1] != 0) take_staged(true, timeout_);
    shared_params = {};
    decode(std::vector<int64_t>(w, w + buffer.numel() - 1), shared_prompts, shared_params, shared_cache);
  }
  uint64_t version = 0;
  bool torn = false;
  {
    std::lock_guard<std::mutex> lock(weights_->mutex);  // one snapshot: the version the torn flag is about
    version = weights_->version, torn = weights_->torn;
  }
  if (version == 0)
    throw Error("RolloutEngine::generate: no weights yet (created from a config alone; load_weights or a sync first)");
  if (torn)
    throw Error("RolloutEngine::generate: the last weight sync (in place) failed; waiting for a good one (version " +
                std::to_string(version) + " is partly overwritten)");
  return nn::generate(*model_, shared_prompts, shared_params, shared_cache);
}

}  // namespace tessera
