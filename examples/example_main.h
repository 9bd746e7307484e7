// How every example's main() ends on an error: one line on stderr naming the program (and its
// rank), exit status 1. An exception that escaped main() would reach std::terminate, which prints
// LibTorch's whole backtrace (a c10::Error's what() carries one) and aborts with SIGABRT.
//
//   int main(int argc, char** argv) {
//     ...parse the arguments...
//     std::string who = "generate";
//     return tessera::examples::run_main(who, [&] { ...; who = "generate (rank 1)"; ...; return 0; });
//   }
// prints e.g. "generate (rank 1): out/model: tensor 'model.embed_tokens.weight' has shape [256, 192],
// the config needs [1099511627776, 192]".
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>
#include <string>

namespace tessera::examples {

// An exception's message on one line: a c10::Error without its backtrace, and the lines of a
// multi-line message (several configuration errors) joined by "; ".
inline std::string one_line(const std::exception& e) {
  const auto* c10_error = dynamic_cast<const c10::Error*>(&e);
  const std::string text = c10_error ? c10_error->what_without_backtrace() : e.what();
  std::string out;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(begin, end - begin);
    line.erase(0, line.find_first_not_of(" \t"));
    if (!line.empty()) out += (out.empty() ? "" : "; ") + line;
    begin = end + 1;
  }
  return out;
}

// Runs `body` (which returns the exit status). Whatever it throws becomes "<who>: <one line>" on
// stderr and status 1; `who` is read when the error is printed, so the body may add the rank.
template <class Body>
int run_main(const std::string& who, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), one_line(e).c_str());
  } catch (...) {
    std::fprintf(stderr, "%s: failed with an exception that is not a std::exception\n", who.c_str());
  }
  return 1;
}

}  // namespace tessera::examples
