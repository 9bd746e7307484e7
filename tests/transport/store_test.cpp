// The rendezvous Store in one process: namespaces, shared namespaces between jobs, counters, and
// timeouts whose errors name the key and the job.
// The rendezvous headers include LibTorch's, whose logging defines a glog-style CHECK: they come
// before Catch so that Catch's CHECK is the one in force.
#include "transport/rendezvous/store_client.h"
#include "transport/rendezvous/store_server.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <unistd.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "core/error.h"
#include "transport/store.h"

using namespace tessera::transport;
using namespace std::chrono_literals;

namespace {

std::string temp_path() {
  char name[] = "/tmp/tessera_store_test_XXXXXX";
  int fd = mkstemp(name);
  close(fd);
  std::remove(name);
  return name;
}

}  // namespace

TEST_CASE("file store: namespaces keep jobs and scopes apart", "[store]") {
  auto path = temp_path();
  StoreOptions a_opts{"jobA", 5000ms}, b_opts{"jobB", 5000ms};
  auto a = Store::file(path, a_opts);
  auto b = Store::file(path, b_opts);
  a->set("k", std::string("from A"));
  b->set("k", std::string("from B"));
  CHECK(a->get_string("k") == "from A");
  CHECK(b->get_string("k") == "from B");
  CHECK(a->prefix() == "jobA/");
  auto scoped = a->scoped("comm")->scoped("world");
  CHECK(scoped->prefix() == "jobA/comm/world/");
  CHECK_FALSE(scoped->check({"k"}));
  scoped->set("k", std::string("inner"));
  CHECK(a->get_string("comm/world/k") == "inner");
  // The shared namespace is the same for both jobs.
  a->shared("meet")->set("hello", std::string("A was here"));
  CHECK(b->shared("meet")->get_string("hello") == "A was here");
  CHECK(a->add("counter", 2) == 2);
  CHECK(a->add("counter", 3) == 5);
  CHECK(a->remove("k"));
  CHECK_FALSE(a->check({"k"}));
  std::vector<uint8_t> bytes{0, 1, 255, 0};
  a->set("bytes", bytes);
  CHECK(a->get("bytes") == bytes);
  std::remove(path.c_str());
}

TEST_CASE("file store: a wait that times out names the key and the job", "[store]") {
  auto path = temp_path();
  auto a = Store::file(path, {"trainer", 5000ms});
  auto t0 = std::chrono::steady_clock::now();
  try {
    a->scoped("ucx")->get("never", 300ms);
    FAIL("get returned");
  } catch (const tessera::TimeoutError& e) {
    std::string what = e.what();
    CHECK(what.find("'trainer/ucx/never'") != std::string::npos);
    CHECK(what.find("job 'trainer'") != std::string::npos);
    CHECK(what.find("300 ms") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  std::remove(path.c_str());
}

TEST_CASE("tcp store: server and clients of two jobs in one process", "[store]") {
  TcpStoreOptions server;
  server.port = 29631;
  server.is_server = true;
  auto a = Store::tcp(server, {"train", 5000ms});
  TcpStoreOptions client = server;
  client.is_server = false;
  auto b = Store::tcp(client, {"rollout", 5000ms});
  a->shared("ucx")->set("train/size", std::string("2"));
  CHECK(b->shared("ucx")->get_string("train/size") == "2");
  CHECK_FALSE(b->check({"train/size"}));  // b's own namespace is "rollout/"
  CHECK(a->where() == "tcp store 127.0.0.1:29631");
  try {
    b->wait({"x", "y"}, 200ms);
    FAIL("wait returned");
  } catch (const tessera::TimeoutError& e) {
    std::string what = e.what();
    CHECK(what.find("'rollout/x', 'rollout/y'") != std::string::npos);
    CHECK(what.find("job 'rollout'") != std::string::npos);
  }
}

TEST_CASE("tcp store: no server within the connect timeout is an error, not a hang", "[store]") {
  TcpStoreOptions client;
  client.port = 29632;
  client.connect_timeout = 500ms;
  auto t0 = std::chrono::steady_clock::now();
  CHECK_THROWS_AS(Store::tcp(client, {"lonely", 1000ms}), tessera::TransportError);
  CHECK(std::chrono::steady_clock::now() - t0 < 20s);
  CHECK_THROWS_AS(Store::tcp(TcpStoreOptions{"127.0.0.1", 70000}, {}), tessera::TransportError);
}

namespace {

// A non-loopback IPv4 address of this machine, or "" when it has none.
std::string other_local_address() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (ifaddrs* i = list; i && out.empty(); i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
    char host[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, host, sizeof host);
    out = host;
  }
  freeifaddrs(list);
  return out;
}

}  // namespace

TEST_CASE("tcp store: only peers holding the secret get in; the refused change nothing", "[store][rendezvous]") {
  TcpStoreOptions server;
  server.port = 29633;
  server.is_server = true;
  server.secret = "the job's secret";
  auto owner = Store::tcp(server, {"train", 5000ms});
  owner->set("weights/version", std::string("7"));
  TcpStoreOptions intruder = server;
  intruder.is_server = false;
  intruder.connect_timeout = 2000ms;
  for (const std::string wrong : {"", "the job's secreT", "another job's secret"}) {
    intruder.secret = wrong;
    INFO("secret '" << wrong << "'");
    CHECK_THROWS_WITH(Store::tcp(intruder, {"train", 1000ms}), Catch::Contains("refused this process") &&
                                                                     Catch::Contains("TESSERA_STORE_SECRET"));
  }
  // A peer that speaks garbage instead of the handshake is cut off too.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(29633);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    const std::string junk(64, 'x');
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    char buffer[128];
    ssize_t n = 0, total = 0;
    while ((n = ::recv(fd, buffer, sizeof buffer, 0)) > 0) total += n;
    CHECK(total == 7 + 32 + 1);  // greeting, nonce, the refusal byte: then closed
    ::close(fd);
  }
  // Nothing changed, and the rightful peers still meet.
  TcpStoreOptions member = intruder;
  member.secret = server.secret;
  auto peer = Store::tcp(member, {"train", 5000ms});
  CHECK(peer->get_string("weights/version") == "7");
  CHECK(peer->add("counter", 2) == 2);
}

// LibTorch 2.x's c10d::Store::clone, which its process groups call: a second connection to the
// same server that sees and changes the same keys, and holds the same secret.
TEST_CASE("tcp store: a cloned client is another connection to the same keys", "[store][rendezvous]") {
  rendezvous::StoreServer server("127.0.0.1", 0, "clone secret");
  auto client = c10::make_intrusive<rendezvous::StoreClient>("127.0.0.1", server.port(), "clone secret", 2000ms, 3000ms);
  client->set("a", std::vector<uint8_t>{1, 2, 3});
  auto copy = client->clone();
  REQUIRE(copy.get() != client.get());
  CHECK(copy->get("a") == std::vector<uint8_t>{1, 2, 3});
  CHECK(copy->add("n", 5) == 5);
  CHECK(client->add("n", 1) == 6);
  CHECK(copy->getTimeout() == 3000ms);
  CHECK(server.refused() == 0);
  client.reset();
  CHECK(copy->check({"a", "n"}));  // the copy outlives the original
}

TEST_CASE("tcp store: the server listens on the address it is given and nowhere else", "[store][rendezvous]") {
  TcpStoreOptions server;
  server.port = 29634;
  server.is_server = true;
  auto owner = Store::tcp(server, {"train", 5000ms});
  const std::string other = other_local_address();
  if (other.empty()) {
    WARN("this machine has no non-loopback IPv4 address: only the loopback half runs");
    return;
  }
  TcpStoreOptions outside;
  outside.host = other;
  outside.port = 29634;
  outside.connect_timeout = 500ms;
  CHECK_THROWS_WITH(Store::tcp(outside, {"train", 1000ms}), Catch::Contains("cannot connect"));
}
