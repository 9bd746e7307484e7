#include "transport/self_test.h"

#include <ATen/ATen.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <sstream>

#include "core/error.h"
#include "transport/communicator.h"
#include "transport/store.h"
#include "transport/ucx/ucx_context.h"
#include "transport/ucx/ucx_endpoint.h"
#include "transport/ucx/ucx_memory.h"
#include "transport/ucx/ucx_peers.h"

namespace tessera::transport {
namespace {

using Clock = std::chrono::steady_clock;

int free_port() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// One line "<order> <rank> <text>\n" per check, written atomically (< PIPE_BUF).
void report(int fd, int order, int rank, const std::string& text) {
  std::string line = std::to_string(order) + " " + std::to_string(rank) + " " + text.substr(0, 400) + "\n";
  ssize_t ignored = write(fd, line.data(), line.size());
  (void)ignored;
}

uint8_t pattern(size_t i) { return static_cast<uint8_t>((i * 131 + 7) & 0xff); }

// The child's whole life; returns its exit status.
int child(int rank, const SelfTestOptions& o, int port, int fd) {
  int order = 0;
  try {
    TcpStoreOptions tcp;
    tcp.port = port;
    tcp.is_server = rank == 0;
    tcp.connect_timeout = o.timeout;
    auto store = Store::tcp(tcp, {"doctor", o.timeout});
    store->add("arrived", 1);
    if (rank == 0) {
      while (store->add("arrived", 0) < o.processes) usleep(1000);
      report(fd, order, rank, "store: " + std::to_string(o.processes) + " processes met on 127.0.0.1:" +
                                  std::to_string(port) + ": ok");
    }
    ++order;
    CommunicatorOptions co;
    co.timeout = o.timeout;
    auto comm = Communicator::gloo(store, rank, o.processes, co);
    const int64_t n = static_cast<int64_t>(o.elements);
    // all_reduce of (i % 1000) + rank: the sum is p * (i % 1000) + p (p - 1) / 2, exact in fp32.
    auto i = at::arange(n, at::kLong);
    auto t = (i % 1000 + rank).to(at::kFloat);
    comm->all_reduce(t)->wait();
    const int p = o.processes;
    auto expect = (i % 1000 * p + p * (p - 1) / 2).to(at::kFloat);
    bool ok = at::equal(t, expect);
    if (rank == 0) report(fd, order, rank, std::string("gloo all_reduce: ") + (ok ? "ok" : "FAILED: wrong sum") + " (" +
                                           std::to_string(n) + " floats)");
    ++order;
    const int64_t chunk = n / p + 1;
    auto in = (at::arange(chunk * p, at::kLong) % 1000 + rank).to(at::kFloat);
    auto out = at::empty({chunk}, at::kFloat);
    comm->reduce_scatter(in, out)->wait();
    auto full = (at::arange(chunk * p, at::kLong) % 1000 * p + p * (p - 1) / 2).to(at::kFloat);
    bool rs_ok = at::equal(out, full.narrow(0, rank * chunk, chunk));
    report(fd, order, rank, std::string("gloo reduce_scatter: ") + (rs_ok ? "ok" : "FAILED: wrong chunk"));
    ++order;
    ok = ok && rs_ok;
    if (rank <= 1 && p >= 2) {
      UcxContextOptions uo;
      uo.transports = o.ucx_transports;
      UcxContext context(uo);
      UcxPeers peers(context, store, "doctor", rank, 2, "doctor-ucx");
      peers.connect("doctor");
      const size_t bytes = (1 << 20) + 3;
      std::vector<uint8_t> buffer(bytes, 0);
      auto& peer = peers.endpoint("doctor", 1 - rank);
      if (rank == 1) {
        UcxMemory memory(context, buffer.data(), bytes);
        peers.publish_memory("target", memory);
        uint8_t done = 0;
        ucx_receive(context, &done, 1, 1, o.timeout);
        bool same = true;
        for (size_t k = 0; k < bytes; ++k) same = same && buffer[k] == pattern(k);
        uint8_t answer = same ? 1 : 0;
        peer.send(&answer, 1, 2, o.timeout);
        ok = ok && same;
      } else {
        for (size_t k = 0; k < bytes; ++k) buffer[k] = pattern(k);
        auto t0 = Clock::now();
        peer.put(buffer.data(), bytes, peers.remote_key("doctor", 1, "target"), 0, o.timeout);
        peer.flush(o.timeout);
        double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        uint8_t done = 1, answer = 0;
        peer.send(&done, 1, 1, o.timeout);
        ucx_receive(context, &answer, 1, 2, o.timeout);
        std::ostringstream line;
        line.precision(3);
        line << "ucx put: " << (answer ? "ok" : "FAILED: target saw different bytes") << " (" << bytes << " bytes, "
             << ms << " ms)";
        report(fd, order, rank, line.str());
        ok = ok && answer == 1;
      }
    }
    ++order;
    comm->barrier()->wait();  // rank 0 hosts the store: nobody leaves before everyone is done
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    static const char* names[] = {"store", "gloo all_reduce", "gloo reduce_scatter", "ucx put", "finish"};
    report(fd, order, rank, std::string(names[order < 5 ? order : 4]) + ": FAILED on rank " + std::to_string(rank) +
                                ": " + e.what());
    return 1;
  }
}

}  // namespace

SelfTestReport run_transport_self_test(const SelfTestOptions& options) {
  SelfTestReport result;
  const auto start = Clock::now();
  if (options.processes < 2) {
    result.lines.push_back("self test: needs at least 2 processes");
    return result;
  }
  const int port = options.port ? options.port : free_port();
  int fds[2];
  if (port == 0 || pipe(fds) != 0) {
    result.lines.push_back("self test: no free port or pipe");
    return result;
  }
  std::vector<pid_t> pids;
  for (int rank = 0; rank < options.processes; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      close(fds[0]);
      int status = child(rank, options, port, fds[1]);
      close(fds[1]);
      _exit(status);
    }
    if (pid < 0) {
      result.lines.push_back(std::string("self test: fork failed: ") + std::strerror(errno));
      break;
    }
    pids.push_back(pid);
  }
  close(fds[1]);
  // Collect lines until every child closed the pipe or the deadline passed.
  std::string text;
  const auto deadline = start + options.timeout + std::chrono::seconds(10);
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    pollfd pfd{fds[0], POLLIN, 0};
    if (poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 1000))) <= 0) continue;
    char buf[4096];
    ssize_t got = read(fds[0], buf, sizeof buf);
    if (got <= 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  close(fds[0]);
  bool all_exited_ok = pids.size() == static_cast<size_t>(options.processes);
  for (pid_t pid : pids) {
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 100 && (done = waitpid(pid, &status, WNOHANG)) == 0; ++i) usleep(20000);
    if (done == 0) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.lines.push_back("self test: process " + std::to_string(pid) + " overran " +
                             std::to_string(options.timeout.count()) + " ms and was killed");
      all_exited_ok = false;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      all_exited_ok = false;
    }
  }
  std::multimap<std::pair<int, int>, std::string> ordered;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    int order = 0, rank = 0;
    fields >> order >> rank;
    std::string rest;
    std::getline(fields, rest);
    ordered.emplace(std::make_pair(order, rank), rest.empty() ? rest : rest.substr(1));
  }
  std::vector<std::string> checks;
  bool failed_line = false;
  for (auto& [key, message] : ordered) {
    if (key.first == 2 && key.second != 0 && message.find("FAILED") == std::string::npos) continue;  // one per check
    failed_line = failed_line || message.find("FAILED") != std::string::npos;
    checks.push_back(message);
  }
  result.lines.insert(result.lines.begin(), checks.begin(), checks.end());
  result.ok = all_exited_ok && !failed_line && checks.size() >= 4;
  result.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return result;
}

}  // namespace tessera::transport
