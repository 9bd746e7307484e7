// What one process of a two-job test knows about itself (tests/transport/two_jobs.py and the other
// drivers start a training and a rollout job that share one store): its launch environment, its
// role (TESSERA_UCX_ROLE), and the small ZeRO config the sync tests train with.
#pragma once

#include <cstdlib>
#include <string>

#include "transport/launch_env.h"

namespace tessera::testing {

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline const transport::LaunchEnv kEnv = transport::LaunchEnv::from_env();
inline const bool kTraining = env("TESSERA_UCX_ROLE") == "train";

// AdamW at lr 1e-2 (every weight moves each step), small buckets (several per backward); at
// stage 3 every projection and embedding partitioned (norms and biases stay gathered).
// `parameter_nvme_path`: stage 3 with the parameters' partitions on NVMe there (small chunks: evicted).
inline std::string sync_test_engine_toml(int stage, const std::string& parameter_nvme_path = "") {
  return "train_micro_batch_size_per_gpu = 2\ngradient_accumulation_steps = 1\n[optimizer]\ntype = \"AdamW\"\n"
         "[optimizer.params]\nlr = 1e-2\n[zero_optimization]\nstage = " + std::to_string(stage) +
         "\nreduce_bucket_size = 4000\n" + (stage == 3 ? "stage3_param_persistence_threshold = 64\n" : "") +
         (parameter_nvme_path.empty() ? std::string()
                                      : "[zero_optimization.offload_param]\ndevice = \"nvme\"\nnvme_path = \"" +
                                            parameter_nvme_path + "\"\nbuffer_size = 4096\nbuffer_count = 3\n") +
         "[tessera.transport]\ncollective_timeout_ms = 60000\n";
}

}  // namespace tessera::testing
