#include "transport/liveness.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstdio>
#include <map>
#include <mutex>
#include <thread>

#include "transport/launch_env.h"

namespace tessera::transport {
namespace {

struct Running {
  std::function<std::string()> describe;
  std::chrono::steady_clock::time_point since;
};

// Never destroyed: a communicator's thread may still finish an operation (and erase its entry)
// while the process exits and destroys its statics.
std::mutex& running_mutex() {
  static auto* m = new std::mutex;
  return *m;
}
std::map<uint64_t, Running>& running() {
  static auto* r = new std::map<uint64_t, Running>;
  return *r;
}

void beat_forever(int fd, std::chrono::milliseconds interval) {
  for (;;) {
    std::string line = "beat";
    const auto waits = running_operations(std::chrono::milliseconds(1000));
    if (!waits.empty()) line += " " + waits;
    line += "\n";
    // MSG_NOSIGNAL: a launcher that went away must not kill the rank with SIGPIPE.
    const ssize_t sent = ::send(fd, line.data(), line.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;  // nobody listens
    std::this_thread::sleep_for(interval);
  }
}

}  // namespace

RunningOperation::RunningOperation(std::function<std::string()> describe) {
  static uint64_t next = 0;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(running_mutex());
  id_ = ++next;
  running().emplace(id_, Running{std::move(describe), now});
}

RunningOperation::~RunningOperation() {
  std::lock_guard<std::mutex> lock(running_mutex());
  running().erase(id_);
}

std::string running_operations(std::chrono::milliseconds older_than) {
  const auto now = std::chrono::steady_clock::now();
  std::string out;
  std::lock_guard<std::mutex> lock(running_mutex());
  for (const auto& [id, r] : running()) {
    const double s = std::chrono::duration<double>(now - r.since).count();
    if (now - r.since < older_than) continue;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, " for %.1f s", s);
    out += (out.empty() ? "" : "; ") + r.describe() + seconds;
  }
  return out;
}

void start_heartbeat() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int fd = env_int("TESSERA_HEARTBEAT_FD", -1);
    if (fd < 0) return;
    const int interval = env_int("TESSERA_HEARTBEAT_INTERVAL_MS", 1000);
    std::thread(beat_forever, fd, std::chrono::milliseconds(interval > 0 ? interval : 1000)).detach();
  });
}

}  // namespace tessera::transport
