#include "core/optim/split_state_store.h"

#include <ATen/ATen.h>

#include "core/error.h"

namespace tessera::optim {
namespace {

int64_t bytes(const at::Tensor& t) { return t.defined() ? int64_t(t.numel() * t.element_size()) : 0; }

int64_t part_bytes(const std::vector<at::Tensor>& states) {
  int64_t n = 0;
  for (const auto& s : states) n += bytes(s);
  return n;
}

int64_t partition_numel(const SplitStateStore::Group& g) { return g.sub_groups.empty() ? 0 : g.sub_groups.back().second; }
bool has_host(const SplitStateStore::Group& g) { return g.host_sub_groups > 0; }
bool has_device(const SplitStateStore::Group& g) { return g.host_sub_groups < int64_t(g.sub_groups.size()); }

// The host copy of a device part's tensor, appended to the host part's.
at::Tensor joined(const at::Tensor& host, const at::Tensor& device) {
  return at::cat({host, device.to(host.options(), /*non_blocking=*/false, /*copy=*/false)});
}

}  // namespace

SplitStateStore::SplitStateStore(std::vector<Group> groups) : groups_(std::move(groups)), paged_(groups_.size()) {
  for (size_t i = 0; i < groups_.size(); ++i) {
    const auto& g = groups_[i];
    const auto where = "split state store: flat group " + std::to_string(i) + ": ";
    int64_t next = 0;
    for (const auto& [b, e] : g.sub_groups) {
      if (b != next || e <= b) throw Error(where + "sub-groups are not contiguous from 0");
      next = e;
    }
    if (g.host_sub_groups < 0 || g.host_sub_groups > int64_t(g.sub_groups.size()))
      throw Error(where + std::to_string(g.host_sub_groups) + " host sub-groups of " + std::to_string(g.sub_groups.size()));
    const int64_t host_numel = split(g), device_numel = partition_numel(g) - host_numel;
    auto check = [&](const Part& p, int64_t numel, const char* name) {
      if (p.master.defined() && p.master.numel() != numel)
        throw Error(where + "the " + name + " part's master has " + std::to_string(p.master.numel()) + " elements, not " +
                    std::to_string(numel));
      for (const auto& s : p.states)
        if (s.numel() != numel)
          throw Error(where + "a " + name + " part's state has " + std::to_string(s.numel()) + " elements, not " +
                      std::to_string(numel));
    };
    if (has_host(g)) check(g.host, host_numel, "host");
    if (has_device(g)) check(g.device, device_numel, "device");
    if (has_host(g) && has_device(g)) {  // paged into one tensor each: alike
      if (g.host.master.defined() != g.device.master.defined() ||
          (g.host.master.defined() && g.host.master.scalar_type() != g.device.master.scalar_type()))
        throw Error(where + "the host and device parts' masters differ in kind");
      if (g.host.states.size() != g.device.states.size())
        throw Error(where + "the host and device parts hold different numbers of states");
      for (size_t k = 0; k < g.host.states.size(); ++k)
        if (g.host.states[k].scalar_type() != g.device.states[k].scalar_type())
          throw Error(where + "state " + std::to_string(k) + "'s dtype differs between the host and device parts");
    }
  }
}

const SplitStateStore::Group& SplitStateStore::group_at(int64_t group) const {
  if (group < 0 || size_t(group) >= groups_.size()) throw Error("split state store: no flat group " + std::to_string(group));
  return groups_[size_t(group)];
}

int64_t SplitStateStore::split(const Group& g) const {
  return g.host_sub_groups == 0 ? 0 : g.sub_groups.at(size_t(g.host_sub_groups - 1)).second;
}

bool SplitStateStore::on_host(int64_t group, int64_t sub_group) const {
  const auto& g = group_at(group);
  if (sub_group < 0 || size_t(sub_group) >= g.sub_groups.size())
    throw Error("split state store: flat group " + std::to_string(group) + " has no sub-group " + std::to_string(sub_group));
  return sub_group < g.host_sub_groups;
}

SubGroupState SplitStateStore::acquire(int64_t group, int64_t sub_group) {
  settle();  // a lent partition may have been written (a checkpoint load, a refresh)
  const bool host = on_host(group, sub_group);
  const auto& g = groups_[size_t(group)];
  const auto& part = host ? g.host : g.device;
  const auto [begin, end] = g.sub_groups[size_t(sub_group)];
  const int64_t offset = begin - (host ? 0 : split(g));
  SubGroupState out;
  if (part.master.defined()) out.master = part.master.narrow(0, offset, end - begin);
  for (const auto& s : part.states) out.states.push_back(s.narrow(0, offset, end - begin));
  return out;
}

const SplitStateStore::Part& SplitStateStore::page_in(int64_t group) const {
  auto& paged = paged_[size_t(group)];
  if (paged) return *paged;
  const auto& g = groups_[size_t(group)];
  Part p;
  if (g.host.master.defined()) p.master = joined(g.host.master, g.device.master);
  for (size_t k = 0; k < g.host.states.size(); ++k) p.states.push_back(joined(g.host.states[k], g.device.states[k]));
  paged = std::move(p);
  return *paged;
}

at::Tensor SplitStateStore::partition_master(int64_t group) const {
  const auto& g = group_at(group);
  if (has_host(g) && has_device(g)) return page_in(group).master;
  return (has_device(g) ? g.device : g.host).master;
}

std::vector<at::Tensor> SplitStateStore::partition_states(int64_t group) const {
  const auto& g = group_at(group);
  if (has_host(g) && has_device(g)) return page_in(group).states;
  return (has_device(g) ? g.device : g.host).states;
}

void SplitStateStore::settle() {
  for (size_t i = 0; i < groups_.size(); ++i) {
    auto& paged = paged_[i];
    if (!paged) continue;
    auto& g = groups_[i];
    const int64_t s = split(g), rest = partition_numel(g) - s;
    auto back = [&](const at::Tensor& whole, at::Tensor& host, at::Tensor& device) {
      host.copy_(whole.narrow(0, 0, s));
      device.copy_(whole.narrow(0, s, rest));
    };
    if (paged->master.defined()) back(paged->master, g.host.master, g.device.master);
    for (size_t k = 0; k < paged->states.size(); ++k) back(paged->states[k], g.host.states[k], g.device.states[k]);
    paged.reset();
  }
}

int64_t SplitStateStore::bytes_held(Side side, Held held) const {
  auto of = [held](const Part& p) { return held == Held::master ? bytes(p.master) : part_bytes(p.states); };
  int64_t n = 0;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const auto& g = groups_[i];
    if (side == Side::host) {
      if (has_host(g)) n += of(g.host);
      if (paged_[i]) n += of(*paged_[i]);  // paged-in partitions are host memory too
    } else if (has_device(g)) {
      n += of(g.device);
    }
  }
  return n;
}

std::vector<at::Tensor> SplitStateStore::device_masters() const {
  std::vector<at::Tensor> out;
  for (const auto& g : groups_)
    if (has_device(g) && g.device.master.defined()) out.push_back(g.device.master);
  return out;
}

std::vector<at::Tensor> SplitStateStore::device_states() const {
  std::vector<at::Tensor> out;
  for (const auto& g : groups_)
    if (has_device(g))
      for (const auto& s : g.device.states) out.push_back(s);
  return out;
}

}  // namespace tessera::optim
