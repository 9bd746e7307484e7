// The GRPO main job's checkpoints (grpo --checkpoint-dir DIR --save-every N, --resume, --stop-at):
//  - the policy engine's own checkpoint (weights, optimizer states, counters; Engine::save_checkpoint,
//    at any layout), whose client_state holds the GRPO step reached and the prompt generator's state;
//  - the KL reference (the policy after the warm-up, frozen) once, as a Hugging Face directory
//    DIR/reference, written when the run starts so that a resume needs no warm-up.
// The rollout job keeps no state of its own: its sampling seed is a function of (seed, step), and
// the training job tells it the step to start from (the store key "start_step"); the first sync
// after a resume is a full one (a new WeightSender has no version to build a delta on).
#pragma once

#include <nlohmann/json.hpp>

#include <random>
#include <sstream>
#include <string>

#include "core/error.h"

namespace grpo {

struct ResumePoint {
  int step = 0;  // GRPO steps done
  std::mt19937_64 prompt_rng;
};

inline std::string client_state(int step, const std::mt19937_64& prompt_rng) {
  std::ostringstream rng;
  rng << prompt_rng;  // the generator's whole state, as text (the standard's round trip)
  return nlohmann::json{{"grpo_step", step}, {"prompt_rng", rng.str()}}.dump();
}

inline ResumePoint resume_point(const std::string& client_state, const std::string& where) {
  ResumePoint r;
  try {
    const auto j = nlohmann::json::parse(client_state);
    r.step = j.at("grpo_step").get<int>();
    std::istringstream rng(j.at("prompt_rng").get<std::string>());
    rng >> r.prompt_rng;
    if (rng.fail() || r.step < 0) throw tessera::Error("a bad grpo_step or prompt_rng");
  } catch (const std::exception& e) {
    throw tessera::CheckpointError(where + ": not a GRPO checkpoint (its client_state lacks grpo_step / prompt_rng: " +
                                   e.what() + ")");
  }
  return r;
}

inline std::string reference_dir(const std::string& checkpoint_dir) { return checkpoint_dir + "/reference"; }

}  // namespace grpo
