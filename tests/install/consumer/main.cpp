// Uses the installed headers and libraries of tessera; prints "consumer ok <version>" on success.
#include <tessera/core/error.h>
#include <tessera/core/version.h>

#include <iostream>

int main() {
  try {
    throw tessera::ConfigError("probe");
  } catch (const tessera::Error& e) {
    if (std::string(e.what()) != "probe") return 1;
  }
  std::cout << "consumer ok " << TESSERA_VERSION_STRING << "\n";
  return 0;
}
