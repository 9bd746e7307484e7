// What every engine test process shares: its rank and world size from tessera-launch's
// environment (RANK, WORLD_SIZE; 0 and 1 when run alone) and the training corpus.
#pragma once

#include <cstdlib>

#include "core/data/byte_corpus.h"

namespace tessera::engine_testing {

inline int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

inline const int kRank = env_int("RANK", 0);
inline const int kWorld = env_int("WORLD_SIZE", 1);

// Debian's license texts (base-files), loaded once per process.
inline const data::ByteCorpus& corpus() {
  static data::ByteCorpus c(data::ByteCorpus::default_paths());
  return c;
}

}  // namespace tessera::engine_testing
