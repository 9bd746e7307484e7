#include "core/optim/nvme_state_store.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <chrono>
#include <cstring>

#include "core/elapsed.h"
#include "core/error.h"
#include "core/io/huge_page_buffer.h"

namespace tessera::optim {
namespace {

constexpr int64_t kPage = io::UringFile::kAlignment;
int64_t round_up(int64_t n) { return (n + kPage - 1) / kPage * kPage; }

}  // namespace

struct NvmeStateStore::Impl {
  enum class SlotState { free, reading, ready, acquired, writing };
  struct Slot {
    at::Tensor buffer;  // uint8 [record capacity], 2 MiB aligned
    char* data = nullptr;
    int64_t piece = -1;
    SlotState state = SlotState::free;
    io::UringFile::Ticket ticket;
  };
  struct Piece {
    int64_t group, sub_group, begin, end;
    int64_t offset = 0, bytes = 0;  // of the record in the file
    std::vector<int64_t> parts;     // byte offsets in the record: master (if any), then each state
  };
  struct Whole {
    at::Tensor master;
    std::vector<at::Tensor> states;
  };

  std::vector<Group> groups;
  std::vector<int64_t> first_piece;  // per group
  std::vector<Piece> pieces;
  std::unique_ptr<io::UringFile> file;
  std::vector<Slot> slots;
  std::vector<uint64_t> hashes;  // per piece, of its record as last written
  bool paged_in = false;
  std::vector<Whole> whole;
  NvmeStoreStats stats;

  std::string name(const Piece& p) const {
    return file->path() + ": flat group " + std::to_string(p.group) + " sub-group " + std::to_string(p.sub_group);
  }

  int64_t index(int64_t g, int64_t s) const {
    if (g < 0 || size_t(g) >= groups.size()) throw Error("nvme state store: no flat group " + std::to_string(g));
    if (s < 0 || size_t(s) >= groups[size_t(g)].sub_groups.size())
      throw Error("nvme state store: flat group " + std::to_string(g) + " has no sub-group " + std::to_string(s));
    return first_piece[size_t(g)] + s;
  }

  Slot* slot_of(int64_t piece) {
    for (auto& slot : slots)
      if (slot.piece == piece && slot.state != SlotState::free) return &slot;
    return nullptr;
  }

  // The views of a record's parts, in a slot's buffer.
  SubGroupState views(const Slot& slot, const Piece& p) const {
    const auto& g = groups[size_t(p.group)];
    const int64_t n = p.end - p.begin;
    SubGroupState out;
    size_t part = 0;
    auto view = [&](at::ScalarType dtype) {
      return at::from_blob(slot.data + p.parts[part++], {n}, at::TensorOptions().dtype(dtype));
    };
    if (g.master_dtype != at::ScalarType::Undefined) out.master = view(g.master_dtype);
    for (auto dtype : g.state_dtypes) out.states.push_back(view(dtype));
    return out;
  }

  void verify(const Slot& slot, const Piece& p) const {
    const uint64_t h = XXH3_64bits(slot.data, size_t(p.bytes));
    if (h != hashes[size_t(&p - pieces.data())])
      throw OffloadError(name(p) + ": the record read back (" + std::to_string(p.bytes) + " bytes at offset " +
                         std::to_string(p.offset) + ") is not what the engine wrote there (XXH3 differs): the swap "
                         "file was changed behind the engine's back; nothing of this sub-group was updated");
  }

  void check_size() const {
    const int64_t now = file->size_bytes_now();
    if (now != file->size_bytes())
      throw OffloadError(file->path() + ": the swap file is " + std::to_string(now) + " bytes, the engine wrote " +
                         std::to_string(file->size_bytes()) + " (truncated or replaced behind its back); no sub-group was updated");
  }

  // A slot's I/O in flight, finished: a read is verified (ready), a write leaves the data (ready).
  void settle_io(Slot& slot) {
    if (slot.state != SlotState::reading && slot.state != SlotState::writing) return;
    const auto t0 = std::chrono::steady_clock::now();
    const bool reading = slot.state == SlotState::reading;
    try {
      file->wait(slot.ticket);
    } catch (...) {
      slot.state = SlotState::free, slot.piece = -1, slot.ticket.reset();
      throw;
    }
    slot.ticket.reset();
    (reading ? stats.read_wait_s : stats.write_wait_s) += seconds_since(t0);
    if (reading) {
      try {
        verify(slot, pieces[size_t(slot.piece)]);
      } catch (...) {
        slot.state = SlotState::free, slot.piece = -1;
        throw;
      }
    }
    slot.state = SlotState::ready;
  }

  // A buffer no acquired record is in: a free one, else one whose write ends (the oldest data),
  // else one read ahead (dropped).
  Slot& free_slot() {
    for (auto& s : slots)
      if (s.state == SlotState::free) return s;
    for (SlotState kind : {SlotState::writing, SlotState::ready, SlotState::reading})
      for (auto& s : slots)
        if (s.state == kind) {
          settle_io(s);
          s.state = SlotState::free, s.piece = -1;
          return s;
        }
    throw Error("nvme state store: all " + std::to_string(slots.size()) + " buffers hold acquired sub-groups");
  }

  void start_read(Slot& slot, int64_t piece) {
    const auto& p = pieces[size_t(piece)];
    slot.piece = piece;
    slot.ticket = file->submit(io::IoDirection::read, slot.data, p.bytes, p.offset,
                               "reading flat group " + std::to_string(p.group) + " sub-group " + std::to_string(p.sub_group));
    slot.state = SlotState::reading;
  }

  void start_write(Slot& slot) {
    const auto& p = pieces[size_t(slot.piece)];
    hashes[size_t(slot.piece)] = XXH3_64bits(slot.data, size_t(p.bytes));
    slot.ticket = file->submit(io::IoDirection::write, slot.data, p.bytes, p.offset,
                               "writing flat group " + std::to_string(p.group) + " sub-group " + std::to_string(p.sub_group));
    slot.state = SlotState::writing;
  }

  // Reads ahead of `piece` (in step order, wrapping to the next step's first) into buffers that are
  // free now, without waiting for any.
  void read_ahead(int64_t piece) {
    const int64_t n = int64_t(pieces.size());
    for (int64_t k = 1; k < n && k <= int64_t(slots.size()); ++k) {
      const int64_t next = (piece + k) % n;
      if (slot_of(next)) continue;
      Slot* target = nullptr;
      for (auto& s : slots)
        if (s.state == SlotState::free) { target = &s; break; }
      if (!target) return;
      start_read(*target, next);
    }
  }

  void wait_all() {
    for (auto& s : slots) settle_io(s);
  }

  // The paged-in partitions go back to the file (the next acquire; the buffers held nothing acquired).
  void page_out() {
    if (!paged_in) return;
    wait_all();
    for (auto& s : slots) s.state = SlotState::free, s.piece = -1;
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto& p = pieces[i];
      Slot& slot = free_slot();
      slot.piece = int64_t(i);
      const auto v = views(slot, p);
      const auto& w = whole[size_t(p.group)];
      const int64_t n = p.end - p.begin;
      if (v.master.defined()) v.master.copy_(w.master.narrow(0, p.begin, n));
      for (size_t k = 0; k < v.states.size(); ++k) v.states[k].copy_(w.states[k].narrow(0, p.begin, n));
      start_write(slot);
    }
    whole.clear();
    paged_in = false;
  }

  void page_in() {
    if (paged_in) return;
    wait_all();
    whole.assign(groups.size(), Whole{});
    for (size_t g = 0; g < groups.size(); ++g) {
      const auto& group = groups[g];
      const int64_t numel = group.sub_groups.empty() ? 0 : group.sub_groups.back().second;
      if (group.master_dtype != at::ScalarType::Undefined) whole[g].master = at::empty({numel}, at::dtype(group.master_dtype));
      for (auto dtype : group.state_dtypes) whole[g].states.push_back(at::empty({numel}, at::dtype(dtype)));
    }
    check_size();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto& p = pieces[i];
      Slot* slot = slot_of(int64_t(i));
      if (!slot) {
        slot = &free_slot();
        start_read(*slot, int64_t(i));
        settle_io(*slot);
      }
      const auto v = views(*slot, p);
      auto& w = whole[size_t(p.group)];
      const int64_t n = p.end - p.begin;
      if (v.master.defined()) w.master.narrow(0, p.begin, n).copy_(v.master);
      for (size_t k = 0; k < v.states.size(); ++k) w.states[k].narrow(0, p.begin, n).copy_(v.states[k]);
    }
    // The slots' copies may go stale (a load writes into the paged-in partitions): dropped.
    for (auto& s : slots) s.state = SlotState::free, s.piece = -1;
    paged_in = true;
  }
};

NvmeStateStore::NvmeStateStore(std::vector<Group> groups, const Fill& fill, NvmeStoreOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.groups = std::move(groups);
  int64_t offset = 0, capacity = kPage;
  for (size_t g = 0; g < m.groups.size(); ++g) {
    const auto& group = m.groups[g];
    m.first_piece.push_back(int64_t(m.pieces.size()));
    for (size_t s = 0; s < group.sub_groups.size(); ++s) {
      Impl::Piece p{int64_t(g), int64_t(s), group.sub_groups[s].first, group.sub_groups[s].second};
      const int64_t n = p.end - p.begin;
      int64_t at = 0;
      auto part = [&](at::ScalarType dtype) {
        p.parts.push_back(at);
        at += round_up(n * int64_t(c10::elementSize(dtype)));
      };
      if (group.master_dtype != at::ScalarType::Undefined) part(group.master_dtype);
      for (auto dtype : group.state_dtypes) part(dtype);
      p.bytes = std::max(at, kPage);
      p.offset = offset;
      offset += p.bytes;
      capacity = std::max(capacity, p.bytes);
      m.pieces.push_back(std::move(p));
    }
  }
  m.hashes.assign(m.pieces.size(), 0);
  m.file = std::make_unique<io::UringFile>(options.path, offset, options.aio);
  m.slots.resize(size_t(std::max<int64_t>(3, options.buffers)));
  for (auto& slot : m.slots) {
    slot.buffer = io::huge_page_empty(capacity, at::kByte);
    slot.data = static_cast<char*>(slot.buffer.data_ptr());
  }
  // The initial values, written record by record (host memory stays within the buffers).
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    const auto& p = m.pieces[i];
    auto& slot = m.free_slot();
    slot.piece = int64_t(i);
    std::memset(slot.data, 0, size_t(p.bytes));  // the pages' padding too: records hash the same on every run
    const auto target = m.views(slot, p);
    const auto source = fill(p.group, p.sub_group);
    if (target.master.defined() != source.master.defined() || target.states.size() != source.states.size())
      throw Error(m.name(p) + ": the initial state does not have the store's parts");
    if (target.master.defined()) target.master.copy_(source.master);
    for (size_t k = 0; k < target.states.size(); ++k) target.states[k].copy_(source.states[k]);
    m.start_write(slot);
  }
  m.wait_all();
}

NvmeStateStore::~NvmeStateStore() {
  for (auto& s : impl_->slots) {
    try {
      impl_->settle_io(s);
    } catch (...) {  // the file is removed next: a failed write no longer matters
    }
  }
}

SubGroupState NvmeStateStore::acquire(int64_t group, int64_t sub_group) {
  auto& m = *impl_;
  const int64_t i = m.index(group, sub_group);
  m.page_out();
  m.check_size();
  Impl::Slot* slot = m.slot_of(i);
  if (slot && slot->state == Impl::SlotState::acquired)
    throw Error(m.name(m.pieces[size_t(i)]) + ": acquired twice without a release");
  if (slot && slot->state == Impl::SlotState::ready) {
    ++m.stats.prefetched;
  } else if (slot && slot->state == Impl::SlotState::writing) {
    ++m.stats.prefetched;  // still in memory: its write ends first
    m.settle_io(*slot);
  } else if (slot && m.file->completed(slot->ticket)) {
    ++m.stats.prefetched;  // read ahead, and the read is done: verified now
    m.settle_io(*slot);
  } else {
    ++m.stats.waited_reads;
    if (!slot) {
      slot = &m.free_slot();
      m.start_read(*slot, i);
    }
    m.settle_io(*slot);
  }
  slot->state = Impl::SlotState::acquired;
  auto out = m.views(*slot, m.pieces[size_t(i)]);
  m.read_ahead(i);
  return out;
}

void NvmeStateStore::release(int64_t group, int64_t sub_group) {
  auto& m = *impl_;
  const int64_t i = m.index(group, sub_group);
  Impl::Slot* slot = m.slot_of(i);
  if (!slot || slot->state != Impl::SlotState::acquired) throw Error(m.name(m.pieces[size_t(i)]) + ": released without an acquire");
  m.start_write(*slot);
  m.read_ahead(i);
}

at::Tensor NvmeStateStore::partition_master(int64_t group) const {
  impl_->page_in();
  return impl_->whole.at(size_t(group)).master;
}

std::vector<at::Tensor> NvmeStateStore::partition_states(int64_t group) const {
  impl_->page_in();
  return impl_->whole.at(size_t(group)).states;
}

int64_t NvmeStateStore::master_bytes() const {
  int64_t n = 0;
  for (const auto& w : impl_->whole)
    if (w.master.defined()) n += int64_t(w.master.numel() * w.master.element_size());
  return n;
}

int64_t NvmeStateStore::state_bytes() const {
  int64_t n = 0;
  for (const auto& w : impl_->whole)
    for (const auto& t : w.states) n += int64_t(t.numel() * t.element_size());
  return n;
}

void NvmeStateStore::flush() {
  auto& m = *impl_;
  m.wait_all();
  if (m.paged_in) return;
  // The next step starts at the first sub-group: read the first records now, behind the next
  // forward and backward, into the buffers that hold the last ones (a pass in step order would
  // evict those before their turn). Their I/O errors surface at their acquire.
  const int64_t first = std::min<int64_t>(int64_t(m.pieces.size()), int64_t(m.slots.size()));
  for (auto& slot : m.slots)
    if (slot.state == Impl::SlotState::ready && slot.piece >= first) slot.state = Impl::SlotState::free, slot.piece = -1;
  if (!m.pieces.empty()) m.read_ahead(int64_t(m.pieces.size()) - 1);
}

int64_t NvmeStateStore::buffer_bytes() const {
  int64_t n = 0;
  for (const auto& s : impl_->slots) n += int64_t(s.buffer.numel());
  return n;
}

int64_t NvmeStateStore::file_bytes() const { return impl_->file->size_bytes(); }
const std::string& NvmeStateStore::path() const { return impl_->file->path(); }

NvmeStoreStats NvmeStateStore::stats() const {
  auto out = impl_->stats;
  out.io = impl_->file->counters();
  return out;
}

}  // namespace tessera::optim
