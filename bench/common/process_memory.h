// This process's memory as the kernel reports it, for benchmarks' JSON lines.
#pragma once

#include <fstream>
#include <string>

namespace tessera::bench {

// A field of /proc/self/status in MiB ("VmRSS": resident now, "VmHWM": its peak); -1 if absent.
inline double status_mib(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field + ":", 0) == 0) return std::stod(line.substr(field.size() + 1)) / 1024.0;
  return -1;
}

}  // namespace tessera::bench
