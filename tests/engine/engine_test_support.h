// What every engine test process shares: its rank and world size from tessera-launch's
// environment (RANK, WORLD_SIZE; 0 and 1 when run alone) and the training corpus.
#pragma once

#include "core/data/byte_corpus.h"
#include "transport/launch_env.h"

namespace tessera::engine_testing {

inline const int kRank = transport::LaunchEnv::from_env().rank;
inline const int kWorld = transport::LaunchEnv::from_env().world_size;

// Debian's license texts (base-files), loaded once per process.
inline const data::ByteCorpus& corpus() {
  static data::ByteCorpus c(data::ByteCorpus::default_paths());
  return c;
}

}  // namespace tessera::engine_testing
