// ErrorList collects the problems found in one file so that a user sees all of them at once.
// Each line reads  FILE[:LINE]: KEY.PATH: what is wrong (the value, what was expected).
#pragma once

#include <string>
#include <vector>

namespace tessera::config::detail {

class ErrorList {
 public:
  explicit ErrorList(std::string origin) : origin_(std::move(origin)) {}

  void add(const std::string& path, int line, const std::string& message) {
    std::string where = origin_;
    if (line > 0) where += ":" + std::to_string(line);
    lines_.push_back(where + ": " + (path.empty() ? std::string("(top level)") : path) + ": " + message);
  }
  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }
  // Throws one ConfigError holding every line; does nothing when there is none.
  void raise_if_any() const;

 private:
  std::string origin_;
  std::vector<std::string> lines_;
};

}  // namespace tessera::config::detail
