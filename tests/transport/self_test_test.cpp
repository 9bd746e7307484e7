// The doctor's transport self test forks its own processes: run it and read its report.
#include <catch2/catch.hpp>

#include <iostream>

#include "transport/self_test.h"

TEST_CASE("transport self test passes on this machine", "[self_test]") {
  tessera::transport::SelfTestOptions options;
  options.port = 29641;
  auto report = tessera::transport::run_transport_self_test(options);
  for (const auto& line : report.lines) std::cout << line << "\n";
  std::cout << "took " << report.seconds << " s\n";
  CHECK(report.ok);
  REQUIRE(report.lines.size() == 4);
  CHECK(report.lines[0].rfind("store: 2 processes met on 127.0.0.1:29641", 0) == 0);
  CHECK(report.lines[1].rfind("gloo all_reduce: ok", 0) == 0);
  CHECK(report.lines[2] == "gloo reduce_scatter: ok");
  CHECK(report.lines[3].rfind("ucx put: ok", 0) == 0);
}
