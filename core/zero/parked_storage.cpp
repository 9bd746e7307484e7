#include "core/zero/parked_storage.h"

#include <ATen/ATen.h>
#include <c10/core/Allocator.h>

#include <algorithm>

#include "core/error.h"

namespace tessera::zero {
namespace {

// The storage's bytes as a flat uint8 tensor (no copy).
at::Tensor bytes_of(const c10::intrusive_ptr<c10::StorageImpl>& storage, size_t nbytes, c10::Device device) {
  auto view = at::empty({0}, at::TensorOptions().dtype(at::kByte).device(device));
  view.set_(c10::Storage(storage), 0, {int64_t(nbytes)}, {1});
  return view;
}

}  // namespace

int64_t ParkedStorages::park(const std::vector<at::Tensor>& tensors, HostMemory host) {
  int64_t moved = 0;
  for (const auto& t : tensors) {
    if (!t.defined()) continue;
    auto* impl = t.storage().unsafeGetStorageImpl();
    const size_t nbytes = impl->nbytes();
    if (nbytes == 0) continue;
    if (std::any_of(parked_.begin(), parked_.end(), [&](const Parked& p) { return p.storage.get() == impl; })) continue;
    Parked p;
    p.storage = c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(impl);
    p.nbytes = nbytes;
    const c10::Device device = impl->device();
    const bool pinned = host == HostMemory::pinned && device.is_cuda();
    p.host = at::empty({int64_t(nbytes)}, at::TensorOptions().dtype(at::kByte).device(at::kCPU).pinned_memory(pinned));
    p.host.copy_(bytes_of(p.storage, nbytes, device));
    impl->set_data_ptr_noswap(c10::DataPtr(nullptr, device));
    impl->set_nbytes(0);
    moved += int64_t(nbytes);
    parked_.push_back(std::move(p));
  }
  return moved;
}

int64_t ParkedStorages::unpark() {
  int64_t moved = 0;
  for (auto& p : parked_) {
    const c10::Device device = p.storage->device();
    c10::Allocator* allocator = p.storage->allocator();
    if (allocator == nullptr) allocator = c10::GetAllocator(device.type());
    if (allocator == nullptr) throw Error("reload_states: no allocator for " + device.str());
    p.storage->set_data_ptr_noswap(allocator->allocate(p.nbytes));
    p.storage->set_nbytes(p.nbytes);
    bytes_of(p.storage, p.nbytes, device).copy_(p.host);
    moved += int64_t(p.nbytes);
  }
  parked_.clear();
  return moved;
}

int64_t ParkedStorages::bytes() const {
  int64_t n = 0;
  for (const auto& p : parked_) n += int64_t(p.nbytes);
  return n;
}

}  // namespace tessera::zero
