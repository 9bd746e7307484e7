#include "core/optim/state_store.h"

#include "core/error.h"

namespace tessera::optim {
namespace {

int64_t bytes(const at::Tensor& t) { return t.defined() ? int64_t(t.numel() * t.element_size()) : 0; }

}  // namespace

MemoryStateStore::MemoryStateStore(std::vector<Group> groups) : groups_(std::move(groups)) {}

SubGroupState MemoryStateStore::acquire(int64_t group, int64_t sub_group) {
  if (group < 0 || size_t(group) >= groups_.size()) throw Error("state store: no flat group " + std::to_string(group));
  const auto& g = groups_[size_t(group)];
  if (sub_group < 0 || size_t(sub_group) >= g.sub_groups.size())
    throw Error("state store: flat group " + std::to_string(group) + " has no sub-group " + std::to_string(sub_group));
  const auto [begin, end] = g.sub_groups[size_t(sub_group)];
  SubGroupState out;
  if (g.master.defined()) out.master = g.master.narrow(0, begin, end - begin);
  for (const auto& s : g.states) out.states.push_back(s.narrow(0, begin, end - begin));
  return out;
}

int64_t MemoryStateStore::master_bytes() const {
  int64_t n = 0;
  for (const auto& g : groups_) n += bytes(g.master);
  return n;
}

int64_t MemoryStateStore::state_bytes() const {
  int64_t n = 0;
  for (const auto& g : groups_)
    for (const auto& s : g.states) n += bytes(s);
  return n;
}

}  // namespace tessera::optim
