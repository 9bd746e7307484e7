#include "core/io/uring_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace tessera::io {

struct UringFile::Request {
  std::mutex mu;
  std::condition_variable cv;
  int64_t remaining = 0;  // pieces not yet completed
  std::string error;      // the first failure
  std::string what;
};

namespace {

struct Piece {
  UringFile::Ticket request;
  IoDirection direction;
  char* buffer;
  int64_t bytes;
  int64_t offset;
};

std::string errno_text(int e) { return std::strerror(e); }

void finish_piece(const UringFile::Ticket& r, const std::string& error) {
  std::lock_guard<std::mutex> lock(r->mu);
  if (!error.empty() && r->error.empty()) r->error = error;
  if (--r->remaining == 0) r->cv.notify_all();
}

}  // namespace

// One ring and the thread that feeds and reaps it.
struct UringFile::Worker {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Piece*> queue;
  bool stop = false;
  io_uring ring{};
  bool ring_ready = false;
  std::thread thread;

  void run(int fd, const AioSettings& s, const std::string& path) {
    int64_t inflight = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (inflight == 0) cv.wait(lock, [&] { return stop || !queue.empty(); });
        if (stop && inflight == 0) break;
        const bool may_fill = s.overlap_events || inflight == 0;
        while (may_fill && inflight < s.queue_depth && !queue.empty()) {
          Piece* p = queue.front();
          queue.pop_front();
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          if (p->direction == IoDirection::read)
            io_uring_prep_read(sqe, fd, p->buffer, unsigned(p->bytes), uint64_t(p->offset));
          else
            io_uring_prep_write(sqe, fd, p->buffer, unsigned(p->bytes), uint64_t(p->offset));
          io_uring_sqe_set_data(sqe, p);
          ++inflight;
          if (s.single_submit) io_uring_submit(&ring);
        }
      }
      if (!s.single_submit) io_uring_submit(&ring);
      if (inflight == 0) continue;
      io_uring_cqe* cqe = nullptr;
      __kernel_timespec slice{0, 2'000'000};  // look at the queue again every 2 ms
      const int w = io_uring_wait_cqe_timeout(&ring, &cqe, &slice);
      if (w == -ETIME || w == -EINTR) continue;
      if (w < 0) {  // the ring itself failed: fail what is in flight rather than hang
        fail_inflight(inflight, path, "io_uring_wait_cqe: " + errno_text(-w));
        continue;
      }
      unsigned head = 0, seen = 0;
      io_uring_for_each_cqe(&ring, head, cqe) {
        ++seen;
        --inflight;
        complete(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), cqe->res, path);
      }
      io_uring_cq_advance(&ring, seen);
    }
  }

  // A completed piece: done, retried (EINTR/EAGAIN), continued (a short transfer), or failed.
  void complete(Piece* p, int res, const std::string& path) {
    const char* verb = p->direction == IoDirection::read ? "read" : "write";
    auto where = [&] {
      return path + ": " + verb + " of " + std::to_string(p->bytes) + " bytes at offset " + std::to_string(p->offset) +
             " (" + p->request->what + ")";
    };
    if (res == -EINTR || res == -EAGAIN) return requeue(p);
    if (res < 0) return fail(p, where() + " failed: " + errno_text(-res));
    if (res == 0 && p->direction == IoDirection::read)
      return fail(p, where() + ": the file ends there (truncated behind the engine's back?)");
    if (res == 0) return fail(p, where() + " wrote nothing (disk full?)");
    if (res < p->bytes) {
      if (res % kAlignment != 0) return fail(p, where() + ": only " + std::to_string(res) + " bytes transferred");
      p->buffer += res, p->offset += res, p->bytes -= res;
      return requeue(p);
    }
    finish_piece(p->request, "");
    delete p;
  }

  void requeue(Piece* p) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_front(p);
  }

  void fail(Piece* p, const std::string& error) {
    finish_piece(p->request, error);
    delete p;
  }

  void fail_inflight(int64_t& inflight, const std::string& path, const std::string& why) {
    io_uring_cqe* cqe = nullptr;
    while (inflight > 0 && io_uring_peek_cqe(&ring, &cqe) == 0) {
      fail(static_cast<Piece*>(io_uring_cqe_get_data(cqe)), path + ": " + why);
      io_uring_cqe_seen(&ring, cqe);
      --inflight;
    }
    if (inflight > 0) {  // not reaped: their requests time out in wait()
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
      inflight = 0;
    }
  }
};

UringFile::UringFile(std::string path, int64_t size_bytes, AioSettings settings)
    : path_(std::move(path)), size_bytes_(size_bytes), settings_(settings) {
  if (size_bytes_ % kAlignment != 0) throw Error(path_ + ": a swap file's size must be a multiple of 4096");
  if (settings_.block_size < kAlignment || settings_.block_size % kAlignment != 0)
    throw ConfigError("aio.block_size = " + std::to_string(settings_.block_size) + ": expected a multiple of 4096 bytes");
  if (settings_.queue_depth < 1) throw ConfigError("aio.queue_depth = " + std::to_string(settings_.queue_depth) + ": expected >= 1");
  if (settings_.threads < 1) throw ConfigError("aio.thread_count = " + std::to_string(settings_.threads) + ": expected >= 1");
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
  if (fd_ < 0) {
    const int e = errno;
    throw OffloadError(path_ + ": cannot create the swap file: " + errno_text(e) +
                       (e == EINVAL ? " (the filesystem does not support O_DIRECT)" : ""));
  }
  auto fail = [&](const std::string& why) {
    ::close(fd_);
    fd_ = -1;
    throw OffloadError(path_ + ": " + why);
  };
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0)
    fail(errno == EWOULDBLOCK ? "in use by another live engine (locked); give each job its own nvme_path"
                              : "flock: " + errno_text(errno));
  struct stat st{};
  if (::fstat(fd_, &st) != 0) fail("fstat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  replaced_leftover_ = st.st_size > 0;  // unlocked and not empty: a crashed run's, never trusted
  if (::ftruncate(fd_, 0) != 0) fail("ftruncate: " + errno_text(errno));
  if (size_bytes_ > 0 && ::fallocate(fd_, 0, 0, size_bytes_) != 0) {
    const int e = errno;
    std::string free_text;
    struct statvfs vfs{};
    if (::fstatvfs(fd_, &vfs) == 0) free_text = ", " + std::to_string(int64_t(vfs.f_bavail) * int64_t(vfs.f_frsize)) + " free";
    ::ftruncate(fd_, 0);
    ::unlink(path_.c_str());
    fail("cannot reserve " + std::to_string(size_bytes_) + " bytes for the swap file" + free_text + ": " + errno_text(e));
  }
  workers_ = std::make_unique<Worker[]>(size_t(settings_.threads));
  for (int64_t i = 0; i < settings_.threads; ++i) {
    auto& w = workers_[size_t(i)];
    const int r = io_uring_queue_init(unsigned(settings_.queue_depth), &w.ring, 0);
    if (r < 0) {
      for (int64_t j = 0; j < i; ++j) {
        { std::lock_guard<std::mutex> lock(workers_[size_t(j)].mu); workers_[size_t(j)].stop = true; }
        workers_[size_t(j)].cv.notify_all();
        workers_[size_t(j)].thread.join();
        io_uring_queue_exit(&workers_[size_t(j)].ring);
      }
      ::unlink(path_.c_str());
      fail("io_uring_queue_init: " + errno_text(-r) + " (io_uring unavailable? see /proc/sys/kernel/io_uring_disabled)");
    }
    w.ring_ready = true;
    w.thread = std::thread([this, &w] { w.run(fd_, settings_, path_); });
  }
}

UringFile::~UringFile() {
  if (workers_) {
    for (int64_t i = 0; i < settings_.threads; ++i) {
      auto& w = workers_[size_t(i)];
      if (!w.ring_ready) continue;
      { std::lock_guard<std::mutex> lock(w.mu); w.stop = true; }
      w.cv.notify_all();
      w.thread.join();
      io_uring_queue_exit(&w.ring);
      for (Piece* p : w.queue) delete p;
    }
  }
  if (fd_ >= 0) {
    ::unlink(path_.c_str());
    ::close(fd_);
  }
}

UringFile::Ticket UringFile::submit(IoDirection direction, void* buffer, int64_t bytes, int64_t offset, std::string what) {
  if (reinterpret_cast<uintptr_t>(buffer) % kAlignment != 0 || bytes % kAlignment != 0 || offset % kAlignment != 0)
    throw Error(path_ + ": O_DIRECT needs 4096-aligned buffers, sizes and offsets (" + what + ")");
  if (offset < 0 || bytes < 0 || offset + bytes > size_bytes_)
    throw Error(path_ + ": [" + std::to_string(offset) + ", " + std::to_string(offset + bytes) + ") is outside the file (" + what + ")");
  auto request = std::make_shared<Request>();
  request->what = std::move(what);
  const int64_t pieces = (bytes + settings_.block_size - 1) / settings_.block_size;
  request->remaining = pieces;
  totals_.requests += 1;
  totals_.pieces += pieces;
  (direction == IoDirection::read ? totals_.bytes_read : totals_.bytes_written) += bytes;
  for (int64_t k = 0; k < pieces; ++k) {
    const int64_t begin = k * settings_.block_size;
    auto* p = new Piece{request, direction, static_cast<char*>(buffer) + begin, std::min(settings_.block_size, bytes - begin),
                        offset + begin};
    auto& w = workers_[size_t(next_worker_++ % settings_.threads)];
    { std::lock_guard<std::mutex> lock(w.mu); w.queue.push_back(p); }
    w.cv.notify_one();
  }
  return request;
}

void UringFile::wait(const Ticket& ticket) {
  std::unique_lock<std::mutex> lock(ticket->mu);
  if (!ticket->cv.wait_for(lock, settings_.timeout, [&] { return ticket->remaining == 0; }))
    throw OffloadError(path_ + ": " + ticket->what + ": no completion within " + std::to_string(settings_.timeout.count()) + " ms");
  if (!ticket->error.empty()) throw OffloadError(ticket->error);
}

bool UringFile::completed(const Ticket& ticket) const {
  std::lock_guard<std::mutex> lock(ticket->mu);
  return ticket->remaining == 0;
}

int64_t UringFile::size_bytes_now() const {
  struct stat st{};
  if (::fstat(fd_, &st) != 0) throw OffloadError(path_ + ": fstat: " + errno_text(errno));
  return int64_t(st.st_size);
}

IoCounters UringFile::counters() const {
  IoCounters c;
  c.bytes_read = totals_.bytes_read, c.bytes_written = totals_.bytes_written;
  c.requests = totals_.requests, c.pieces = totals_.pieces;
  return c;
}

}  // namespace tessera::io
