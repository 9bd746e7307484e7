// The median of a benchmark's samples (the mean of the two middle ones for an even count; 0 for
// none): what every bench's JSON line reports as its figure.
#pragma once

#include <algorithm>
#include <vector>

namespace tessera::bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return (v[(v.size() - 1) / 2] + v[v.size() / 2]) / 2;
}

}  // namespace tessera::bench
