#include "core/zero/parameter_swap.h"

#include <ATen/ATen.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>

#include "core/elapsed.h"
#include "core/error.h"
#include "core/io/huge_page_buffer.h"

namespace tessera::zero {
namespace {

constexpr int64_t kPage = io::UringFile::kAlignment;
int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

struct ParameterSwap::Impl {
  enum class SlotState { free, reading, clean, dirty, writing };
  struct Slot {
    at::Tensor buffer;  // uint8 [chunk_bytes], 2 MiB aligned
    char* data = nullptr;
    int64_t chunk = -1;
    SlotState state = SlotState::free;
    uint64_t last_use = 0;
    int64_t filled = -1;  // dirty, holding only [0, filled) of its chunk (a writer filling it from its start); -1: all
    io::UringFile::Ticket ticket;
  };
  struct Chunk {
    int64_t group = 0, index = 0;  // chunk `index` of flat group `group`
    int64_t offset = 0;            // in the file
    int64_t bytes = 0;             // of the partition it holds
    int64_t io_bytes = 0;          // bytes rounded up to a page: what is read and written
    bool written = false;
    bool lost = false;  // a write of it failed: its bytes on disk are unknown
    uint64_t hash = 0;  // of io_bytes as last written
    int64_t slot = -1;
  };

  std::vector<Partition> partitions;
  std::vector<int64_t> first_chunk;  // per group
  std::vector<Chunk> chunks;
  int64_t chunk_bytes = 0;
  std::unique_ptr<io::UringFile> file;
  std::vector<Slot> slots;
  at::Tensor scratch;  // one chunk, made when a partly filled chunk first needs the rest of its bytes
  uint64_t clock = 0;
  ParameterSwapStats stats;
  mutable std::mutex mutex;

  int64_t element_size(int64_t g) const { return int64_t(c10::elementSize(partitions[size_t(g)].dtype)); }

  std::string name(int64_t g, int64_t begin, int64_t end) const {
    return file->path() + ": flat group " + std::to_string(g) + " elements [" + std::to_string(begin) + ", " +
           std::to_string(end) + ")";
  }
  std::string name(const Chunk& c) const {
    const int64_t e = element_size(c.group), begin = c.index * chunk_bytes / e;
    return name(c.group, begin, begin + c.bytes / e) + " (chunk " + std::to_string(c.index) + ")";
  }

  void check_group(int64_t g) const {
    if (g < 0 || size_t(g) >= partitions.size())
      throw OffloadError(file->path() + ": no flat group " + std::to_string(g) + " (the swap holds " +
                         std::to_string(partitions.size()) + ")");
  }

  void check_range(int64_t g, int64_t begin, int64_t numel) const {
    check_group(g);
    if (begin < 0 || numel < 0 || begin + numel > partitions[size_t(g)].numel)
      throw OffloadError(name(g, begin, begin + numel) + ": outside the partition of " +
                         std::to_string(partitions[size_t(g)].numel) + " elements");
  }

  void check_tensor(int64_t g, int64_t begin, const at::Tensor& t, const char* what) const {
    check_group(g);
    if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous() || t.dim() != 1)
      throw OffloadError(file->path() + ": flat group " + std::to_string(g) + ": the " + what +
                         " must be a contiguous 1-D CPU tensor");
    if (t.scalar_type() != partitions[size_t(g)].dtype)
      throw OffloadError(name(g, begin, begin + t.numel()) + ": the " + what + " is " +
                         std::string(c10::toString(t.scalar_type())) + ", the partition " +
                         c10::toString(partitions[size_t(g)].dtype));
    check_range(g, begin, t.numel());
  }

  void check_size() const {
    const int64_t now = file->size_bytes_now();
    if (now != file->size_bytes())
      throw OffloadError(file->path() + ": the swap file is " + std::to_string(now) + " bytes, the engine wrote " +
                         std::to_string(file->size_bytes()) + " (truncated or replaced behind its back)");
  }

  void drop(Slot& slot) {
    if (slot.chunk >= 0) chunks[size_t(slot.chunk)].slot = -1;
    slot.chunk = -1, slot.state = SlotState::free, slot.ticket.reset(), slot.filled = -1;
  }

  // A partly filled slot gets the rest of its chunk's bytes: read (and verified) into the scratch
  // buffer, or zeros for a chunk never written.
  void complete(Slot& slot) {
    if (slot.filled < 0) return;
    const auto& c = chunks[size_t(slot.chunk)];
    if (c.lost) throw OffloadError(name(c) + ": an earlier write of this chunk failed, so its values are lost");
    if (c.written) {
      if (!scratch.defined()) scratch = io::huge_page_empty(chunk_bytes, at::kByte);
      auto* data = static_cast<char*>(scratch.data_ptr());
      const auto t0 = std::chrono::steady_clock::now();
      file->wait(file->submit(io::IoDirection::read, data, c.io_bytes, c.offset, "reading " + name(c)));
      stats.read_wait_s += seconds_since(t0);
      ++stats.misses;
      if (XXH3_64bits(data, size_t(c.io_bytes)) != c.hash)
        throw OffloadError(name(c) + ": read back (" + std::to_string(c.io_bytes) + " bytes at offset " +
                           std::to_string(c.offset) + ") is not what the engine wrote there (XXH3 differs): the swap "
                           "file was changed behind the engine's back");
      std::memcpy(slot.data + slot.filled, data + slot.filled, size_t(c.io_bytes - slot.filled));
    } else {
      std::memset(slot.data + slot.filled, 0, size_t(c.io_bytes - slot.filled));
    }
    slot.filled = -1;
  }

  // A slot's I/O in flight, finished: a read is verified (clean), a write leaves the data (clean).
  void settle(Slot& slot) {
    if (slot.state != SlotState::reading && slot.state != SlotState::writing) return;
    const bool reading = slot.state == SlotState::reading;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      file->wait(slot.ticket);
    } catch (...) {
      if (!reading) chunks[size_t(slot.chunk)].lost = true;
      drop(slot);
      throw;
    }
    slot.ticket.reset();
    (reading ? stats.read_wait_s : stats.write_wait_s) += seconds_since(t0);
    if (reading) {
      const auto& c = chunks[size_t(slot.chunk)];
      if (XXH3_64bits(slot.data, size_t(c.io_bytes)) != c.hash) {
        const std::string what = name(c);
        drop(slot);
        throw OffloadError(what + ": read back (" + std::to_string(c.io_bytes) + " bytes at offset " +
                           std::to_string(c.offset) + ") is not what the engine wrote there (XXH3 differs): the swap "
                           "file was changed behind the engine's back");
      }
    }
    slot.state = SlotState::clean;
  }

  void start_read(Slot& slot, int64_t chunk) {
    auto& c = chunks[size_t(chunk)];
    slot.chunk = chunk, c.slot = int64_t(&slot - slots.data());
    slot.ticket = file->submit(io::IoDirection::read, slot.data, c.io_bytes, c.offset, "reading " + name(c));
    slot.state = SlotState::reading;
  }

  void start_write(Slot& slot) {
    auto& c = chunks[size_t(slot.chunk)];
    c.hash = XXH3_64bits(slot.data, size_t(c.io_bytes));
    c.written = true, c.lost = false;
    slot.ticket = file->submit(io::IoDirection::write, slot.data, c.io_bytes, c.offset, "writing " + name(c));
    slot.state = SlotState::writing;
    ++stats.write_backs;
  }

  // A buffer holding nothing: a free one, else the least recently used clean one, else (oldest
  // first) one whose write ends, one whose changes are written back, one read ahead.
  Slot& take_slot() {
    for (auto& s : slots)
      if (s.state == SlotState::free) return s;
    for (SlotState kind : {SlotState::clean, SlotState::writing, SlotState::dirty, SlotState::reading}) {
      Slot* oldest = nullptr;
      for (auto& s : slots)
        if (s.state == kind && (!oldest || s.last_use < oldest->last_use)) oldest = &s;
      if (!oldest) continue;
      if (kind == SlotState::dirty) complete(*oldest), start_write(*oldest);
      settle(*oldest);
      drop(*oldest);
      return *oldest;
    }
    throw Error("parameter swap: no buffer");  // unreachable: at least two buffers, none pinned
  }

  // Chunk `chunk` in a buffer: its contents read (or zeros, never written) unless `overwritten`
  // (the caller writes all of its bytes), and no write of it in flight.
  Slot& load(int64_t chunk, bool overwritten) {
    auto& c = chunks[size_t(chunk)];
    if (c.lost && !overwritten)
      throw OffloadError(name(c) + ": an earlier write of this chunk failed, so its values are lost");
    Slot* slot = c.slot >= 0 ? &slots[size_t(c.slot)] : nullptr;
    if (slot) {
      const bool done = slot->state != SlotState::reading || file->completed(slot->ticket);
      ++(done ? stats.hits : stats.misses);
      settle(*slot);
      complete(*slot);
    } else {
      slot = &take_slot();
      if (c.written && !overwritten) {
        ++stats.misses;
        start_read(*slot, chunk);
        settle(*slot);
      } else {
        slot->chunk = chunk, c.slot = int64_t(slot - slots.data());
        if (!c.written) std::memset(slot->data, 0, size_t(c.io_bytes));
        else std::memset(slot->data + c.bytes, 0, size_t(c.io_bytes - c.bytes));  // the page's padding hashes the same
        slot->state = SlotState::clean;
      }
    }
    slot->last_use = ++clock;
    return *slot;
  }

  // Calls f(chunk, byte offset in the chunk, byte offset in the range, bytes) over a range's chunks.
  template <class F>
  void for_chunks(int64_t g, int64_t begin, int64_t numel, F&& f) const {
    const int64_t e = element_size(g);
    int64_t byte = begin * e;
    const int64_t end = (begin + numel) * e;
    while (byte < end) {
      const int64_t k = byte / chunk_bytes, in = byte - k * chunk_bytes;
      const int64_t n = std::min(end - byte, chunk_bytes - in);
      f(first_chunk[size_t(g)] + k, in, byte - begin * e, n);
      byte += n;
    }
  }
};

ParameterSwap::ParameterSwap(std::vector<Partition> partitions, ParameterSwapOptions options)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.partitions = std::move(partitions);
  // No buffer larger than the largest partition: a small model with DeepSpeed's default buffer_size
  // (1e8 elements) gets buffers of its own size.
  int64_t largest = 1;
  for (const auto& p : m.partitions) largest = std::max(largest, p.numel * int64_t(c10::elementSize(p.dtype)));
  m.chunk_bytes = round_up(std::min(std::max<int64_t>(options.chunk_bytes, 1), largest), kPage);
  if (options.buffers < 2)
    throw ConfigError(options.path + ": a parameter swap needs at least 2 buffers (buffer_count), got " +
                      std::to_string(options.buffers));
  int64_t offset = 0;
  for (size_t g = 0; g < m.partitions.size(); ++g) {
    const int64_t bytes = m.partitions[g].numel * int64_t(c10::elementSize(m.partitions[g].dtype));
    m.first_chunk.push_back(int64_t(m.chunks.size()));
    for (int64_t k = 0; k * m.chunk_bytes < bytes; ++k) {
      Impl::Chunk c;
      c.group = int64_t(g), c.index = k, c.offset = offset;
      c.bytes = std::min(m.chunk_bytes, bytes - k * m.chunk_bytes);
      c.io_bytes = round_up(c.bytes, kPage);
      offset += c.io_bytes;  // a partition's last chunk takes its pages only
      m.chunks.push_back(c);
    }
  }
  m.file = std::make_unique<io::UringFile>(options.path, std::max(offset, kPage), options.aio);
  m.slots.resize(size_t(options.buffers));
  for (auto& slot : m.slots) {
    slot.buffer = io::huge_page_empty(m.chunk_bytes, at::kByte);
    slot.data = static_cast<char*>(slot.buffer.data_ptr());
  }
}

ParameterSwap::~ParameterSwap() {
  for (auto& s : impl_->slots) {
    try {
      impl_->settle(s);
    } catch (...) {  // the file is removed next: a failed I/O no longer matters
    }
  }
}

void ParameterSwap::read(int64_t group, int64_t begin, const at::Tensor& dst) {
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.check_tensor(group, begin, dst, "destination");
  m.check_size();
  auto* out = static_cast<char*>(dst.data_ptr());
  m.for_chunks(group, begin, dst.numel(), [&](int64_t chunk, int64_t in, int64_t at, int64_t n) {
    std::memcpy(out + at, m.load(chunk, false).data + in, size_t(n));
  });
}

void ParameterSwap::write(int64_t group, int64_t begin, const at::Tensor& src) {
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.check_tensor(group, begin, src, "source");
  m.check_size();
  const auto* from = static_cast<const char*>(src.data_ptr());
  m.for_chunks(group, begin, src.numel(), [&](int64_t chunk, int64_t in, int64_t at, int64_t n) {
    auto& c = m.chunks[size_t(chunk)];
    Impl::Slot* slot = c.slot >= 0 ? &m.slots[size_t(c.slot)] : nullptr;
    if (slot && slot->filled >= 0 && slot->filled == in) {  // the writer goes on where it stopped
      slot->filled += n;
      if (slot->filled == c.bytes) {  // whole: only the page's padding is left (zeros: hashed alike every time)
        std::memset(slot->data + c.bytes, 0, size_t(c.io_bytes - c.bytes));
        slot->filled = -1;
      }
    } else if (!slot && in == 0 && n < c.bytes && !c.lost) {  // a writer starts a chunk: nothing to read yet
      slot = &m.take_slot();
      slot->chunk = chunk, c.slot = int64_t(slot - m.slots.data()), slot->filled = n;
    } else {
      slot = &m.load(chunk, in == 0 && n == c.bytes);
    }
    std::memcpy(slot->data + in, from + at, size_t(n));
    slot->state = Impl::SlotState::dirty;
    slot->last_use = ++m.clock;
    if (in + n == c.bytes) m.start_write(*slot);  // write-behind: the writer has moved past this chunk
  });
}

void ParameterSwap::prefetch(int64_t group, int64_t begin, int64_t numel) {
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  m.check_range(group, begin, numel);
  int64_t started = 0;
  m.for_chunks(group, begin, numel, [&](int64_t chunk, int64_t, int64_t, int64_t) {
    auto& c = m.chunks[size_t(chunk)];
    // Leave one buffer for the use in progress; never evict a changed or just-used chunk for a guess.
    if (c.slot >= 0 || !c.written || c.lost || started + 1 >= int64_t(m.slots.size())) return;
    Impl::Slot* target = nullptr;
    for (auto& s : m.slots)
      if (s.state == Impl::SlotState::free) { target = &s; break; }
    if (!target)
      for (auto& s : m.slots)
        if (s.state == Impl::SlotState::clean && (!target || s.last_use < target->last_use)) target = &s;
    if (!target) return;
    m.drop(*target);
    m.start_read(*target, chunk);
    target->last_use = ++m.clock;
    ++started;
  });
}

void ParameterSwap::flush() {
  auto& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mutex);
  std::exception_ptr failure;
  for (auto& s : m.slots) {
    try {
      if (s.state == Impl::SlotState::dirty) m.complete(s), m.start_write(s);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  for (auto& s : m.slots) {
    try {
      if (s.state == Impl::SlotState::writing) m.settle(s);
    } catch (...) {
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
}

at::Tensor ParameterSwap::read_whole(int64_t group) {
  impl_->check_group(group);
  auto out = at::empty({impl_->partitions[size_t(group)].numel}, at::dtype(impl_->partitions[size_t(group)].dtype));
  read(group, 0, out);
  return out;
}

const std::vector<ParameterSwap::Partition>& ParameterSwap::partitions() const { return impl_->partitions; }

int64_t ParameterSwap::buffer_bytes() const {
  int64_t n = impl_->scratch.defined() ? int64_t(impl_->scratch.numel()) : 0;
  for (const auto& s : impl_->slots) n += int64_t(s.buffer.numel());
  return n;
}

int64_t ParameterSwap::file_bytes() const { return impl_->file->size_bytes(); }
const std::string& ParameterSwap::path() const { return impl_->file->path(); }

ParameterSwapStats ParameterSwap::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  auto out = impl_->stats;
  out.io = impl_->file->counters();
  return out;
}

}  // namespace tessera::zero
