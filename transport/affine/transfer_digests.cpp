#include "transport/affine/transfer_digests.h"

#include <algorithm>
#include <sstream>

namespace tessera::transport {

// Per-tensor digests as one store value: "<hex digest> <tensor name>" lines, in batch order.
std::string encode_transfer_digests(const TransferDigests& digests) {
  std::ostringstream out;
  for (const auto& [name, d] : digests) out << std::hex << d << ' ' << name << '\n';
  return out.str();
}

TransferDigests decode_transfer_digests(const std::string& text) {
  TransferDigests out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    const auto space = line.find(' ');
    if (space == std::string::npos) continue;
    out.emplace_back(line.substr(space + 1), std::stoull(line.substr(0, space), nullptr, 16));
  }
  return out;
}

// What a refusal names: the first transfer (in batch order) whose plan differs between two processes.
std::string first_differing_transfer(const TransferDigests& a,
                                     const TransferDigests& b) {
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].first != b[i].first)
      return "transfer " + std::to_string(i) + " is tensor '" + a[i].first + "' on the first and '" + b[i].first +
             "' on the second";
    if (a[i].second != b[i].second) {
      size_t more = 0;
      for (size_t j = i + 1; j < std::min(a.size(), b.size()); ++j) more += a[j] != b[j] ? 1 : 0;
      return "tensor '" + a[i].first + "' is planned differently (transfer " + std::to_string(i) + " of " +
             std::to_string(a.size()) + (more ? "; " + std::to_string(more) + " later transfers differ too" : "") +
             ": source or target maps, dtype or placement)";
    }
  }
  if (a.size() != b.size())
    return "the batches have " + std::to_string(a.size()) + " and " + std::to_string(b.size()) + " transfers";
  return "every tensor's plan is the same (the batches differ in session or epoch)";
}

}  // namespace tessera::transport
