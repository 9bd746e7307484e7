// grpo: the RL loop tessera is built for, on a task with a verifiable reward (reverse --digits
// digits, default 3, reverse_task.h; both jobs must get the same: the rollout checks the prompts'
// length). Two jobs, started together by run_grpo.py:
//   --role train    (DP ranks) a Qwen3-style policy under the ZeRO engine (examples/grpo/policy:
//                   the bundled tiny-qwen3 with 2 layers); a short supervised warm-up teaches the
//                   format, then GRPO: for each step it publishes prompts, reads the rollout job's G
//                   samples per prompt with their log-probabilities, scores them, normalises rewards
//                   per group ((r - mean) / (std + 1e-6); --no-std-norm: r - mean), recomputes the
//                   policy's log-probabilities (pi_old: the policy before this batch's first update;
//                   --epochs updates per batch, so from the second on the ratio moves and the clip
//                   matters), minimises the clipped-ratio objective (eps 0.2) with an optional k3 KL
//                   to the post-warm-up policy (--kl-beta) and an optional entropy bonus (--entropy-coef),
//                   token-level normalisation over the whole batch, then syncs the weights into the
//                   rollout job (--delta: changed elements only). --advantage position (opt-in, not GRPO's
//                   sequence-level credit): each answer digit's advantage is its own position's correctness,
//                   group-normalised.
//   --role rollout  (TP ranks) a RolloutEngine; per step it generates with the weights after every
//                   update so far (version step + 1: 1 is the warmed-up policy) and publishes samples.
//                   --sync-mode in_place: it receives each sync itself, generation cannot run while
//                   the weights are written (pause = WeightSyncStats::pause_ms); double_buffered: the
//                   sink listens on its own thread and writes a standby copy, the rollout waits for the
//                   version and generate() swaps it in (pause = RolloutEngine::last_swap_ms()).
// The jobs exchange prompts and samples (token ids, log-probs as hex floats) through the store
// under "shared/grpo/"; weights go over UCX (actors/rollout/weight_sync.h).
// Rank 0 of the training job prints a line per step (reward, KL, loss, tokens/s, the
// training-vs-rollout log-prob mismatch, sync ms and whether it was a delta, pause ms, sync bytes)
// and writes a CSV (also the lr, the mean negative log-prob of the samples, the clipped fraction,
// the accuracy of each answer position and the policy's mean entropy at the answer tokens).
// --checkpoint-dir DIR --save-every N saves (and --resume continues) the run: grpo_checkpoint.h.
#include <CLI/CLI.hpp>

#include <torch/torch.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <random>
#include <sstream>
#include <thread>

#include "actors/actor_runtime.h"
#include "actors/engine/engine.h"
#include "actors/rollout/rollout_engine.h"
#include "actors/rollout/weight_sync.h"
#include "core/config/load.h"
#include "examples/example_main.h"
#include "core/error.h"
#include "core/nn/decoder.h"
#include "examples/grpo/grpo_checkpoint.h"
#include "examples/grpo/reverse_task.h"
#include "transport/launch_env.h"
#include "transport/store.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

struct Args {
  std::string role, model_config = "examples/grpo/policy", csv = "grpo.csv", peer;
  int steps = 250, prompts = 16, group = 8, sft_steps = 8, zero_stage = 2;
  int digits = 3;      // the task's length (--digits; at 4 GRPO plateaus at 0.76, see README)
  int new_tokens() const { return digits + 1; }  // generated per sample: the digits and the newline
  int epochs = 1, lr_warmup = 0;
  double lr = 1e-3, sft_lr = 3e-3, temperature = 1.0, clip = 0.2, kl_beta = 0.0, max_grad_norm = 1.0;
  double beta1 = 0.9, beta2 = 0.99, min_lr_ratio = 0.1;
  double entropy_coef = 0.0;  // weight of the per-token entropy bonus (0: off)
  std::string advantage = "sequence";    // sequence | position (see --advantage)
  std::string lr_schedule = "constant";  // constant | linear | cosine (after lr_warmup steps, down to min_lr_ratio)
  bool std_norm = true;                   // advantages (r - mean) / (std + eps); false: r - mean
  uint64_t seed = 1;
  std::string rollout_dtype = "fp32", sync_mode = "in_place";
  std::string offload = "none";  // --offload: the training job's optimizer in host memory (cpu)
  bool offload_states = false;   // --offload-states: the training job's states on the host while the rollout generates
  bool delta = false;
  std::string config;  // --config: a tessera config file; only its [tessera.rollout] is read (the sync's)
  std::string checkpoint_dir;  // grpo_checkpoint.h
  int save_every = 0, stop_at = 0;
  bool resume = false;
  int last_step() const { return stop_at > 0 ? std::min(stop_at, steps) : steps; }  // this run's end
};

// The GRPO learning rate of update `step` (0-based) of `steps`.
double lr_at(const Args& a, int step) {
  if (step < a.lr_warmup) return a.lr * double(step + 1) / double(a.lr_warmup);
  if (a.lr_schedule == "constant") return a.lr;
  const double span = std::max(1, a.steps - a.lr_warmup - 1);
  const double x = std::min(1.0, double(step - a.lr_warmup) / span);
  const double f = a.lr_schedule == "linear" ? 1 - x : 0.5 * (1 + std::cos(3.14159265358979323846 * x));
  return a.lr * (a.min_lr_ratio + (1 - a.min_lr_ratio) * f);
}

std::string encode_samples(const tessera::nn::GenerationResult& out) {
  std::ostringstream s;
  s << std::hexfloat;
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    s << out.tokens[i].size();
    for (auto t : out.tokens[i]) s << ' ' << t;
    for (float lp : out.logprobs[i]) s << ' ' << lp;
    s << '\n';
  }
  return s.str();
}

void decode_samples(const std::string& text, std::vector<std::vector<int64_t>>& tokens,
                    std::vector<std::vector<float>>& logprobs) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    size_t n = 0;
    in >> n;
    tokens.emplace_back(n), logprobs.emplace_back(n);
    for (auto& t : tokens.back()) in >> t;
    for (auto& lp : logprobs.back()) {
      std::string word;
      in >> word;
      lp = std::strtof(word.c_str(), nullptr);  // hex floats: the rollout's bits exactly
    }
  }
}

std::string encode_prompts(const std::vector<std::vector<int64_t>>& prompts) {
  std::ostringstream s;
  for (const auto& p : prompts) {
    for (auto t : p) s << t << ' ';
    s << '\n';
  }
  return s.str();
}

std::vector<std::vector<int64_t>> decode_prompts(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    out.emplace_back();
    for (int64_t t; in >> t;) out.back().push_back(t);
  }
  return out;
}

tessera::WeightSyncOptions sync_options(const Args& a, const tessera::transport::LaunchEnv& env, bool training) {
  // Replica policy, staging budget and timeout: the config file's [tessera.rollout], else the defaults.
  tessera::WeightSyncOptions o;
  if (!a.config.empty()) o = tessera::weight_sync_options(tessera::config::load_config(a.config));
  o.train_job = training ? env.job : a.peer;
  o.rollout_job = training ? a.peer : env.job;
  o.session = "grpo";
  o.delta = a.delta;
  o.mode = a.sync_mode == "double_buffered" ? tessera::SinkMode::double_buffered : tessera::SinkMode::in_place;
  return o;
}

int run_rollout(const Args& a, const tessera::transport::LaunchEnv& env) {
  tessera::RolloutOptions ro;
  ro.config_path = a.model_config;
  ro.dtype = a.rollout_dtype == "bf16" ? at::kBFloat16 : at::kFloat;
  auto rollout = tessera::RolloutEngine::create(ro);
  auto shared = tessera::actors::job_store()->shared("grpo");
  // The step the training job starts from (0, or where its checkpoint left off).
  const int start = std::stoi(shared->get_string("start_step", std::chrono::minutes(5)));
  // The training job hosts the store: when it has nothing to train it waits for every rollout
  // rank to have read the step before it ends.
  if (shared->add("start_seen", 1) == env.world_size) shared->set("start_seen_all", "1");
  if (start >= a.last_step()) return 0;
  tessera::RolloutSink sink(*rollout, sync_options(a, env, false));
  // Weight versions: 0 from the config alone, 1 the warmed-up (or resumed) policy, 1 + s after
  // update s of this run.
  const bool double_buffered = a.sync_mode == "double_buffered";
  if (double_buffered)
    sink.listen();  // every sync lands in the standby copy on the sink's thread; generate() swaps it in
  else
    sink.receive();  // the warmed-up policy
  for (int step = start; step < a.last_step(); ++step) {
    const uint64_t version = uint64_t(step - start) + 1;  // after `step - start` updates of this run
    const auto key = "step" + std::to_string(step) + "/";
    const auto prompts = decode_prompts(shared->get_string(key + "prompts", std::chrono::minutes(5)));
    for (const auto& p : prompts)  // --digits is not part of the sync handshake: both jobs must get the same
      if (grpo::prompt_digits(p) != a.digits)
        throw tessera::Error("grpo rollout: a prompt of " + std::to_string(grpo::prompt_digits(p)) +
                             " digits, but --digits " + std::to_string(a.digits) + " here (both jobs need the same)");
    tessera::WeightSyncStats stats;
    double wait_ms = 0;
    if (double_buffered) {  // on-policy: the weights after `step` updates (staged; live at generate())
      const auto w = Clock::now();
      stats = sink.wait_for_version(version, std::chrono::minutes(5));
      wait_ms = ms_since(w);
    }
    std::vector<std::vector<int64_t>> batch;
    for (const auto& p : prompts)
      for (int g = 0; g < a.group; ++g) batch.push_back(p);
    tessera::nn::SamplingParams params;
    params.temperature = a.temperature;
    params.max_new_tokens = a.new_tokens();
    params.seed = a.seed * 1000003 + uint64_t(step);
    const auto t = Clock::now();
    const auto out = rollout->generate(batch, params);
    const double generate_ms = ms_since(t);
    if (rollout->weight_version() != version)
      throw tessera::Error("grpo rollout: step " + std::to_string(step) + " generated with weight version " +
                           std::to_string(rollout->weight_version()) + ", not " + std::to_string(version));
    if (env.rank == 0) shared->set(key + "samples", encode_samples(out));
    double pause_ms = 0;
    if (double_buffered) {
      pause_ms = rollout->last_swap_ms();  // the swap inside this generate()
    } else {
      const auto w = Clock::now();
      stats = sink.receive();  // in place: generation cannot run for stats.pause_ms of this
      wait_ms = ms_since(w) - stats.pause_ms;
      pause_ms = stats.pause_ms;
    }
    if (env.rank == 0)
      shared->set(key + "rollout", std::to_string(pause_ms) + " " + std::to_string(generate_ms) + " " +
                                       std::to_string(stats.bytes_sent) + " " + std::to_string(wait_ms));
  }
  if (double_buffered) sink.wait_for_version(uint64_t(a.last_step() - start) + 1, std::chrono::minutes(5));  // the last sync
  return 0;
}

int run_train(const Args& a, const tessera::transport::LaunchEnv& env) {
  const auto config = tessera::nn::load_decoder_config(a.model_config);
  tessera::nn::DecoderOptions mo;
  mo.seed = a.seed;
  tessera::nn::DecoderLm policy(config, mo);
  const int world = env.world_size, rank = env.rank;
  const int sequences = a.prompts * a.group;
  if (sequences % world != 0)
    throw tessera::ConfigError("--prompts x --group (" + std::to_string(sequences) + ") must divide over " +
                               std::to_string(world) + " training ranks");
  const std::string toml = "train_micro_batch_size_per_gpu = " + std::to_string(sequences / world) +
                           "\ngradient_accumulation_steps = 1\ngradient_clipping = " + std::to_string(a.max_grad_norm) +
                           "\n[optimizer]\ntype = \"AdamW\"\n[optimizer.params]\nlr = " + std::to_string(a.lr) +
                           "\nbetas = [" + std::to_string(a.beta1) + ", " + std::to_string(a.beta2) + "]\nweight_decay = 0.0\n"
                           "[zero_optimization]\nstage = " + std::to_string(a.zero_stage) + "\n" +
                           // Stage 3: DeepSpeed's "auto" rule (10 x hidden): only the norms stay gathered.
                           (a.zero_stage == 3 ? "stage3_param_persistence_threshold = " +
                                                    std::to_string(10 * config.hidden_size) + "\n"
                                              : std::string()) +
                           (a.offload == "cpu" ? "[zero_optimization.offload_optimizer]\ndevice = \"cpu\"\n" : "");
  auto engine =
      tessera::initialize(policy.module(), tessera::config::load_config_text(toml, tessera::config::Format::toml, "grpo"))
          .engine;
  auto shared = tessera::actors::job_store()->shared("grpo");
  const int D = a.digits;
  const int64_t P = D + 1, T = a.new_tokens();
  if ((a.resume || a.save_every > 0) && a.checkpoint_dir.empty())
    throw tessera::ConfigError("--resume and --save-every need --checkpoint-dir");
  // A resumed run continues from the checkpoint's step, prompt generator, policy and optimizer.
  int start = 0;
  std::mt19937_64 prompt_rng(a.seed * 104729);
  if (a.resume) {
    const auto loaded = engine->load_checkpoint(a.checkpoint_dir);
    auto point = grpo::resume_point(loaded.client_state, loaded.path);
    start = point.step, prompt_rng = point.prompt_rng;
    if (rank == 0) std::printf("grpo: resumed from %s at GRPO step %d\n", loaded.path.c_str(), start);
  }
  if (rank == 0) shared->set("start_step", std::to_string(start));
  if (start >= a.last_step()) {
    if (rank == 0) std::printf("grpo: already at step %d of %d: nothing to train\n", start, a.last_step());
    if (rank == 0) shared->get_string("start_seen_all", std::chrono::minutes(5));  // the store outlives their reads
    return 0;
  }

  // Supervised warm-up on (prompt, answer) pairs: the format, and a start on the task (not again
  // after a resume: the checkpoint holds the policy after it).
  std::mt19937_64 sft_rng(a.seed * 7919 + uint64_t(rank));
  for (int step = 0; step < a.sft_steps && !a.resume; ++step) {
    std::vector<int64_t> flat;
    for (int i = 0; i < sequences / world; ++i) {
      auto p = grpo::random_prompt(sft_rng, D), ans = grpo::answer(p);
      flat.insert(flat.end(), p.begin(), p.end());
      flat.insert(flat.end(), ans.begin(), ans.end());
    }
    auto ids = torch::tensor(flat, torch::kLong).view({sequences / world, P + D + 1});
    auto logits = policy.forward(ids.narrow(1, 0, ids.size(1) - 1));
    auto answer_logits = logits.narrow(1, P - 1, D + 1);
    auto loss = torch::nn::functional::cross_entropy(answer_logits.reshape({-1, answer_logits.size(-1)}),
                                                     ids.narrow(1, P, D + 1).reshape({-1}));
    engine->set_lr(a.sft_lr);
    engine->backward(loss);
    engine->step();
  }
  engine->set_lr(a.lr);
  // The reference for the KL term: the policy after the warm-up, frozen. At stage 3 it is a second
  // engine, a ZeRO inference engine (no optimizer): partitioned like the policy, gathered per unit.
  std::unique_ptr<tessera::nn::DecoderLm> reference;
  std::shared_ptr<tessera::Engine> reference_engine;
  if (a.kl_beta > 0 && a.resume) {
    reference = std::make_unique<tessera::nn::DecoderLm>(
        tessera::nn::load_pretrained(grpo::reference_dir(a.checkpoint_dir), mo));
  } else if (a.kl_beta > 0) {
    reference = std::make_unique<tessera::nn::DecoderLm>(config, mo);
    {
      torch::NoGradGuard no_grad;
      auto gathered = engine->gathered_parameters();  // stage 3: the policy's units are released between steps
      auto ref_params = reference->module()->named_parameters();
      for (const auto& item : policy.module()->named_parameters()) ref_params[item.key()].copy_(item.value());
    }
    if (!a.checkpoint_dir.empty() && rank == 0) reference->save_pretrained(grpo::reference_dir(a.checkpoint_dir));
  }
  if (reference) {
    if (a.zero_stage == 3) {
      const std::string ref_toml = "train_micro_batch_size_per_gpu = " + std::to_string(sequences / world) +
                                   "\n[zero_optimization]\nstage = 3\nstage3_param_persistence_threshold = " +
                                   std::to_string(10 * config.hidden_size) + "\n";
      reference_engine = tessera::initialize(reference->module(), tessera::config::load_config_text(
                                                                       ref_toml, tessera::config::Format::toml, "grpo reference"))
                             .engine;
    }
  }
  tessera::WeightSender sender(*engine, config, sync_options(a, env, true));
  auto first = sender.sync();

  std::ofstream csv;
  if (rank == 0) {
    csv.open(a.csv, start > 0 ? std::ios::app : std::ios::trunc);  // a resumed run continues its curve
    if (start == 0) {
      csv << "step,reward,kl,loss,logprob_mismatch,tokens_per_s,sync_ms,pause_ms,sync_bytes,generate_ms,step_ms,lr,"
             "neg_logprob,clip_frac,delta,changed_elements,full_bytes,rollout_wait_ms";
      for (int k = 0; k < D; ++k) csv << ",acc" << k + 1;
      csv << ",entropy\n";
    }
    std::printf("grpo: %lld-parameter %s policy, %d training ranks (ZeRO-%d%s), %d prompts x %d samples per step, %d "
                "update(s) per batch; warm-up %d steps; sync %s%s; first sync %.1f ms (plan %.1f ms)\n",
                static_cast<long long>(tessera::nn::decoder_parameter_count(config)), config.model_type(), world,
                a.zero_stage, a.offload == "cpu" ? ", optimizer offloaded to host memory" : "", a.prompts, a.group,
                a.epochs, a.sft_steps, a.sync_mode.c_str(), a.delta ? ", delta" : "",
                first.sync_ms, first.plan_ms);
  }
  for (int step = start; step < a.last_step(); ++step) {
    const auto t0 = Clock::now();
    const auto key = "step" + std::to_string(step) + "/";
    std::vector<std::vector<int64_t>> prompts;
    for (int i = 0; i < a.prompts; ++i) prompts.push_back(grpo::random_prompt(prompt_rng, D));
    if (rank == 0) shared->set(key + "prompts", encode_prompts(prompts));
    std::vector<std::vector<int64_t>> tokens;
    std::vector<std::vector<float>> rollout_lp;
    decode_samples(shared->get_string(key + "samples", std::chrono::minutes(5)), tokens, rollout_lp);
    if (int(tokens.size()) != sequences) throw tessera::Error("grpo: the rollout job sent " + std::to_string(tokens.size()) + " samples");
    double reload_ms = 0;
    if (engine->states_offloaded()) {  // --offload-states: back from the host now that the samples are here
      const auto t = Clock::now();
      engine->reload_states();
      reload_ms = ms_since(t);
    }

    // Rewards and group-normalised advantages (every rank computes all; cheap).
    std::vector<double> rewards(static_cast<size_t>(sequences) + 0), advantages(rewards.size());
    std::vector<double> position_right(D, 0.0);
    double mean_reward = 0, neg_logprob = 0;
    int64_t total_tokens = 0;
    for (int i = 0; i < sequences; ++i) {
      const auto& p = prompts[size_t(i / a.group)];
      const auto& c = tokens[size_t(i)];
      rewards[size_t(i)] = grpo::reward(p, c);
      mean_reward += rewards[size_t(i)] / sequences;
      total_tokens += int64_t(c.size());
      for (float lp : rollout_lp[size_t(i)]) neg_logprob -= lp;
      const auto want = grpo::answer(p);
      for (int k = 0; k < D; ++k)
        position_right[size_t(k)] += (k < int(c.size()) && c[size_t(k)] == want[size_t(k)]) ? 1.0 / sequences : 0.0;
    }
    neg_logprob /= double(std::max<int64_t>(1, total_tokens));
    // Group normalisation of one score per sample (score(i) for i in 0..sequences-1) into `out`.
    const auto normalise = [&](const auto& score, auto&& out) {
      for (int g = 0; g < a.prompts; ++g) {
        double m = 0, v = 0;
        for (int j = 0; j < a.group; ++j) m += score(g * a.group + j) / a.group;
        for (int j = 0; j < a.group; ++j) v += std::pow(score(g * a.group + j) - m, 2) / std::max(1, a.group - 1);
        for (int j = 0; j < a.group; ++j)
          out(g * a.group + j, (score(g * a.group + j) - m) / (a.std_norm ? std::sqrt(v) + 1e-6 : 1.0));
      }
    };
    normalise([&](int i) { return rewards[size_t(i)]; }, [&](int i, double x) { advantages[size_t(i)] = x; });
    // --advantage position: answer token k's advantage is its own position's correctness (0 or 1),
    // normalised within the group the same way; the tokens after the digits keep the sequence's.
    std::vector<std::vector<double>> position_adv;
    if (a.advantage == "position") {
      position_adv.assign(size_t(D), std::vector<double>(size_t(sequences)));
      for (int k = 0; k < D; ++k)
        normalise(
            [&](int i) {
              const auto& c = tokens[size_t(i)];
              return double(k < int(c.size()) && c[size_t(k)] == grpo::answer(prompts[size_t(i / a.group)])[size_t(k)]);
            },
            [&](int i, double x) { position_adv[size_t(k)][size_t(i)] = x; });
    }

    // This rank's share of the sequences: prompt + completion, completions right-padded.
    const int share = sequences / world, begin = rank * share;
    auto ids = torch::zeros({share, P + T}, torch::kLong);
    auto mask = torch::zeros({share, T});
    auto adv = torch::empty({share, T});  // per token (the same along a row unless --advantage position)
    auto old_rollout = torch::zeros({share, T});
    for (int i = 0; i < share; ++i) {
      const auto& p = prompts[size_t((begin + i) / a.group)];
      const auto& c = tokens[size_t(begin + i)];
      for (int64_t k = 0; k < P; ++k) ids[i][k] = p[size_t(k)];
      for (size_t k = 0; k < c.size(); ++k) {
        ids[i][P + int64_t(k)] = c[k];
        mask[i][int64_t(k)] = 1;
        old_rollout[i][int64_t(k)] = rollout_lp[size_t(begin + i)][k];
      }
      for (int64_t k = 0; k < T; ++k)
        adv[i][k] = k < int64_t(position_adv.size()) ? position_adv[size_t(k)][size_t(begin + i)]
                                                      : advantages[size_t(begin + i)];
    }
    // The log-probabilities of the sampled tokens; with `entropy`, also each position's entropy of
    // the policy's whole distribution over the vocabulary (-sum p log p).
    const auto log_probs = [&](tessera::nn::DecoderLm& model, torch::Tensor* entropy = nullptr) {
      auto logits = model.forward(ids.narrow(1, 0, P + T - 1)).narrow(1, P - 1, T);
      auto all = torch::log_softmax(logits, -1);
      if (entropy) *entropy = -(all.exp() * all).sum(-1);
      return all.gather(-1, ids.narrow(1, P, T).unsqueeze(-1)).squeeze(-1);
    };
    torch::Tensor ref;
    if (reference) {
      torch::NoGradGuard no_grad;
      // A ZeRO inference engine prefetches within each of its forward() calls (the first records the order).
      ref = reference_engine ? reference_engine->forward([&] { return log_probs(*reference); }) : log_probs(*reference);
    }
    // --epochs updates on the batch: pi_old is the policy before the first (the ratio starts at 1
    // there and moves, within the clip, in the later ones).
    const double lr = lr_at(a, step);
    engine->set_lr(lr);
    torch::Tensor old, kl = torch::zeros({}), loss;
    double mismatch = 0, clip_frac = 0, entropy_mean = 0;
    for (int epoch = 0; epoch < a.epochs; ++epoch) {
      torch::Tensor entropy;
      auto logp = log_probs(policy, &entropy);
      if (epoch == 0) {
        old = logp.detach();
        mismatch = ((old - old_rollout).abs() * mask).sum().item<double>() / std::max(1.0, mask.sum().item<double>());
      }
      auto ratio = torch::exp(logp - old);
      auto objective = torch::min(ratio * adv, torch::clamp(ratio, 1 - a.clip, 1 + a.clip) * adv);
      auto per_token = -objective;
      if (reference) {
        auto k3 = torch::exp(ref - logp) - (ref - logp) - 1;
        per_token = per_token + a.kl_beta * k3;
        if (epoch == 0) kl = (k3.detach() * mask).sum() / mask.sum().clamp_min(1);
      }
      // Entropy bonus (--entropy-coef): rewards spread in each answer token's distribution, against an
      // early collapse onto one answer while the group rewards still vary; normalised like the rest.
      if (a.entropy_coef > 0) per_token = per_token - a.entropy_coef * entropy;
      if (epoch == 0)
        entropy_mean = (entropy.detach() * mask).sum().item<double>() / std::max(1.0, mask.sum().item<double>());
      if (epoch == a.epochs - 1 && a.epochs > 1)
        clip_frac = ((((ratio.detach() - 1).abs() > a.clip).to(torch::kFloat)) * mask).sum().item<double>() /
                    std::max(1.0, mask.sum().item<double>());
      // Token-level normalisation over the whole batch (all ranks): the engine averages the ranks'
      // gradients, so each rank's sum is scaled by world / all tokens.
      auto l = (per_token * mask).sum() * (double(world) / double(std::max<int64_t>(1, total_tokens)));
      if (epoch == 0) loss = l.detach();
      engine->backward(l);
      engine->step();
    }
    const auto sync = sender.sync();
    std::istringstream rollout_line(shared->get_string(key + "rollout", std::chrono::minutes(5)));
    double pause_ms = 0, generate_ms = 0, rollout_bytes = 0, rollout_wait_ms = 0;
    rollout_line >> pause_ms >> generate_ms >> rollout_bytes >> rollout_wait_ms;
    const double step_ms = ms_since(t0);
    if (rank == 0) {
      const double tokens_per_s = double(total_tokens) / (generate_ms / 1000.0);
      std::printf("step %3d | reward %.3f | kl %.4f | loss %+.4f | %.0f tok/s | logprob mismatch %.2e | sync %.1f ms "
                  "(%s) | pause %.1f ms | %lld bytes%s\n",
                  step + 1, mean_reward, kl.item<double>(), loss.item<double>() / world, tokens_per_s, mismatch,
                  sync.sync_ms + sync.verify_ms, sync.delta ? "delta" : "full", pause_ms,
                  static_cast<long long>(sync.bytes_sent),
                  sync.delta ? (" of " + std::to_string(sync.full_bytes) + ", " + std::to_string(sync.changed_elements) +
                                " elements changed")
                                   .c_str()
                             : "");
      std::fflush(stdout);
      csv << step + 1 << "," << mean_reward << "," << kl.item<double>() << "," << loss.item<double>() / world << ","
          << mismatch << "," << tokens_per_s << "," << sync.sync_ms + sync.verify_ms << "," << pause_ms << ","
          << sync.bytes_sent << "," << generate_ms << "," << step_ms << "," << lr << "," << neg_logprob << ","
          << clip_frac << "," << (sync.delta ? 1 : 0) << "," << sync.changed_elements << "," << sync.full_bytes << ","
          << rollout_wait_ms;
      for (double r : position_right) csv << "," << r;
      csv << "," << entropy_mean << "\n";
      csv.flush();
    }
    if (!a.checkpoint_dir.empty() && ((a.save_every > 0 && (step + 1) % a.save_every == 0) || step + 1 == a.last_step())) {
      tessera::CheckpointSaveOptions save;
      save.client_state = grpo::client_state(step + 1, prompt_rng);
      const auto path = engine->save_checkpoint(a.checkpoint_dir, save);
      if (rank == 0) std::printf("grpo: saved checkpoint %s (GRPO step %d)\n", path.c_str(), step + 1);
    }
    // Colocated jobs: the rollout job generates the next step's samples with the weights just sent;
    // meanwhile this job's states wait in host memory (reloaded when the samples arrive).
    if (a.offload_states && step + 1 < a.last_step()) {
      const auto t = Clock::now();
      const auto moved = engine->offload_states();
      if (rank == 0)
        std::printf("grpo: step %d: %.1f MB of states to host memory in %.1f ms (reloaded in %.1f ms before this step)\n",
                    step + 1, double(moved.total()) / 1e6, ms_since(t), reload_ms);
    }
  }
  if (rank == 0) std::printf("grpo: done, %d of %d steps; curve in %s\n", a.last_step(), a.steps, a.csv.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"GRPO on digit reversal: a training job and a rollout job (start both with run_grpo.py)"};
  Args a;
  app.add_option("--role", a.role, "train | rollout")->required()->check(CLI::IsMember({"train", "rollout"}));
  app.add_option("--peer-job", a.peer, "the other job's name (TESSERA_JOB)")->required();
  app.add_option("--model-config", a.model_config, "the policy's config.json (or its directory)");
  app.add_option("--steps", a.steps, "GRPO steps")->check(CLI::PositiveNumber);
  app.add_option("--prompts", a.prompts, "prompts per step")->check(CLI::PositiveNumber);
  app.add_option("--group", a.group, "samples per prompt (G)")->check(CLI::Range(2, 1024));
  app.add_option("--digits", a.digits, "the task: reverse this many digits, 2..8 (both jobs must get the same)")
      ->check(CLI::Range(grpo::kMinDigits, grpo::kMaxDigits));
  app.add_option("--sft-steps", a.sft_steps, "supervised warm-up steps")->check(CLI::NonNegativeNumber);
  app.add_option("--lr", a.lr, "GRPO learning rate");
  app.add_option("--sft-lr", a.sft_lr, "warm-up learning rate");
  app.add_option("--temperature", a.temperature, "sampling temperature");
  app.add_option("--clip", a.clip, "ratio clip epsilon");
  app.add_option("--kl-beta", a.kl_beta, "k3 KL weight to the post-warm-up policy (0: off)");
  app.add_option("--entropy-coef", a.entropy_coef,
                 "weight of the entropy bonus: minus this times each answer token's entropy over the vocabulary, "
                 "token-level normalised like the loss (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--epochs", a.epochs, "GRPO updates per batch (pi_old: the policy before the first)")
      ->check(CLI::PositiveNumber);
  app.add_option("--lr-schedule", a.lr_schedule, "constant | linear | cosine (decay after --lr-warmup to --min-lr-ratio)")
      ->check(CLI::IsMember({"constant", "linear", "cosine"}));
  app.add_option("--lr-warmup", a.lr_warmup, "GRPO steps of linear lr ramp-up")->check(CLI::NonNegativeNumber);
  app.add_option("--min-lr-ratio", a.min_lr_ratio, "the decayed lr at the last step, as a fraction of --lr");
  app.add_option("--max-grad-norm", a.max_grad_norm, "gradient clipping (0: off)")->check(CLI::NonNegativeNumber);
  app.add_option("--beta1", a.beta1, "AdamW beta1");
  app.add_option("--beta2", a.beta2, "AdamW beta2");
  app.add_option("--advantage", a.advantage,
                 "sequence (GRPO: every token of a sample gets its group-normalised reward) | position (each answer "
                 "digit gets its own position's correctness, group-normalised; dense per-token credit)")
      ->check(CLI::IsMember({"sequence", "position"}));
  app.add_flag("!--no-std-norm", a.std_norm, "advantages r - mean (default: (r - mean) / (std + 1e-6) per group)");
  app.add_option("--sync-mode", a.sync_mode,
                 "in_place (generation waits while the weights are written) | double_buffered (written into a standby "
                 "copy, swapped in at the next generate())")
      ->check(CLI::IsMember({"in_place", "double_buffered"}));
  app.add_flag("--delta", a.delta, "delta syncs: only the elements whose bits changed travel");
  app.add_option("--zero-stage", a.zero_stage, "ZeRO stage of the training job")->check(CLI::Range(0, 3));
  app.add_option("--offload", a.offload, "none | cpu: the training job's optimizer (masters, AdamW states, its step) "
                 "in host memory (offload_optimizer.device; needs ZeRO stage 1-3)")
      ->check(CLI::IsMember({"none", "cpu"}));
  app.add_flag("--offload-states", a.offload_states,
               "the training job moves its states (weights, gradients, masters, optimizer states) to host memory after "
               "each sync and back when the samples arrive (offload_states/reload_states, for jobs sharing devices)");
  app.add_option("--rollout-dtype", a.rollout_dtype, "fp32 | bf16 (weights cast on the way)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--config", a.config,
                 "a tessera config file (TOML or DeepSpeed JSON, e.g. configs/autotp.toml) whose [tessera.rollout] "
                 "sets the weight sync's replica_policy, staging_budget_bytes and sync_timeout_ms (both jobs must agree "
                 "on the policy); nothing else in it is used")
      ->check(CLI::ExistingFile);
  app.add_option("--seed", a.seed, "seed of prompts, sampling and initialisation");
  app.add_option("--csv", a.csv, "the curve, written by training rank 0");
  app.add_option("--checkpoint-dir", a.checkpoint_dir, "save checkpoints here (every --save-every steps and at the end)");
  app.add_option("--save-every", a.save_every, "save a checkpoint every N GRPO steps")->check(CLI::NonNegativeNumber);
  app.add_option("--stop-at", a.stop_at, "stop after this step, as a preempted run would (the schedule stays --steps')")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--resume", a.resume, "continue from --checkpoint-dir's latest checkpoint (--steps is the total)");
  CLI11_PARSE(app, argc, argv);
  std::string who = "grpo " + a.role;
  return tessera::examples::run_main(who, [&] {
    const auto env = tessera::transport::LaunchEnv::from_env();
    who += " (rank " + std::to_string(env.rank) + ")";
    return a.role == "train" ? run_train(a, env) : run_rollout(a, env);
  });
}
