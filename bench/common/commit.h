// The short git commit of the working tree the benchmark runs in ("unknown" outside git), printed
// with every result so figures can be traced to code.
#pragma once

#include <cstdio>
#include <string>

namespace tessera::bench {

inline std::string commit() {
  std::string out = "unknown";
  if (FILE* p = popen("git rev-parse --short HEAD 2>/dev/null", "r")) {
    char buf[64] = {0};
    if (fgets(buf, sizeof buf, p)) {
      out = buf;
      out.erase(out.find_last_not_of("\n ") + 1);
    }
    pclose(p);
  }
  return out;
}

}  // namespace tessera::bench
