#include "core/zero/partitioned_construction.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/nn/module.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "core/launch_env.h"

namespace tessera::zero {
namespace {

thread_local PartitionedConstruction* active = nullptr;

struct Entry {
  c10::weak_intrusive_ptr<c10::TensorImpl> parameter;
  ConstructedChunk chunk;
};

struct Chunks {
  std::mutex mutex;
  std::map<const c10::TensorImpl*, Entry> by_parameter;
};

Chunks& chunks() {
  static auto* c = new Chunks;  // never destroyed (parameters may die during static destruction)
  return *c;
}

}  // namespace

PartitionedConstruction::PartitionedConstruction(int world, int rank)
    : outer_(active), world_(world), rank_(rank) {
  if (world_ < 0 || rank_ < 0) {  // from the launcher, read once
    const auto env = LaunchEnv::from_env();
    if (world_ < 0) world_ = env.world_size;
    if (rank_ < 0) rank_ = env.rank;
  }
  if (world_ < 1 || rank_ < 0 || rank_ >= world_)
    throw Error("PartitionedConstruction: rank " + std::to_string(rank_) + " of " + std::to_string(world_));
  active = this;
}

PartitionedConstruction::~PartitionedConstruction() { active = outer_; }

void partition_if_constructing(const std::shared_ptr<torch::nn::Module>& module) {
  if (!active || !module) return;
  for (const auto& item : module->named_parameters(/*recurse=*/false))
    partition_parameter(item.value(), active->world_, active->rank_);
}

void partition_parameter(const at::Tensor& parameter, int W, int r) {
  if (W < 1 || r < 0 || r >= W)
    throw Error("partitioned construction: rank " + std::to_string(r) + " of " + std::to_string(W));
  c10::AutoGradMode no_grad(false);
  auto p = parameter;
  const auto* impl = p.unsafeGetTensorImpl();
  {
    std::lock_guard<std::mutex> lock(chunks().mutex);
    if (chunks().by_parameter.count(impl)) return;  // cut already (a module held twice)
  }
  const int64_t n = p.numel(), k = (n + W - 1) / W;
  auto chunk = at::zeros({k}, p.options().requires_grad(false));
  const int64_t begin = std::min(n, r * k), length = std::min(n, begin + k) - begin;
  if (length > 0) chunk.narrow(0, 0, length).copy_(p.detach().reshape({-1}).narrow(0, begin, length));
  // Free the whole: the parameter keeps its shape, its storage no memory.
  if (n > 0) {
    auto* storage = p.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(c10::DataPtr(nullptr, p.device()));
    storage->set_nbytes(0);
  }
  std::lock_guard<std::mutex> lock(chunks().mutex);
  chunks().by_parameter.insert_or_assign(impl, Entry{c10::weak_intrusive_ptr<c10::TensorImpl>(p.getIntrusivePtr()), {W, r, n, chunk}});
}

std::optional<ConstructedChunk> constructed_chunk(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(chunks().mutex);
  auto it = chunks().by_parameter.find(parameter.unsafeGetTensorImpl());
  if (it == chunks().by_parameter.end() || it->second.parameter.expired()) return std::nullopt;
  return it->second.chunk;
}

bool write_constructed(const at::Tensor& parameter, const at::Tensor& value) {
  auto chunk = constructed_chunk(parameter);
  if (!chunk) return false;
  if (value.numel() != chunk->numel)
    throw Error("partitioned construction: a value of " + std::to_string(value.numel()) + " elements for a parameter of " +
                std::to_string(chunk->numel));
  const int64_t k = chunk->chunk.numel(), begin = std::min(chunk->numel, chunk->rank * k);
  const int64_t length = std::min(chunk->numel, begin + k) - begin;
  c10::AutoGradMode no_grad(false);
  if (length > 0) chunk->chunk.narrow(0, 0, length).copy_(value.detach().reshape({-1}).narrow(0, begin, length));
  return true;  // (the padding past the end stays zero)
}

void forget_constructed(const at::Tensor& parameter) {
  std::lock_guard<std::mutex> lock(chunks().mutex);
  chunks().by_parameter.erase(parameter.unsafeGetTensorImpl());
}

}  // namespace tessera::zero
