// GatherSchedule (actors/gather_schedule.h) on its own, without processes: the record, following
// it, leaving it, what goes ahead within the bucket and the live bound, reuse distance, and ZeRO
// inference windows. Units of 10, 20 and 30 elements; a training window is a forward 0 1 2 and
// its backward 2 1 0. Expected lists are worked out by hand from the rules in the header.
#include <catch2/catch.hpp>

#include <set>

#include "actors/gather_schedule.h"

using tessera::actors::GatherLimits;
using tessera::actors::GatherSchedule;
using Step = GatherSchedule::Step;

namespace {

const std::vector<int64_t> kUnits{10, 20, 30};
const std::vector<int64_t> kWindow{0, 1, 2, 2, 1, 0};

GatherSchedule recorded(GatherLimits limits) {
  GatherSchedule s(kUnits, limits, /*forward_windows=*/false);
  for (int64_t u : kWindow) CHECK(s.fetch(u, true) == Step::recorded);
  s.end_update();
  return s;
}

auto none_gathered = [](int64_t) { return false; };

}  // namespace

TEST_CASE("The first window is the record; later ones follow it and can leave it", "[gather_schedule]") {
  auto s = recorded({1000, 1000, 0});
  CHECK(s.record() == kWindow);
  CHECK_FALSE(s.recording());
  CHECK(s.following());
  CHECK(s.fetch(0, true) == Step::followed);
  CHECK(s.fetch(1, false) == Step::unordered);  // a scope's fetch does not move the window
  CHECK(s.fetch(1, true) == Step::followed);
  CHECK(s.fetch(0, true) == Step::left);  // the record says 2
  CHECK(s.left_at() == 2);
  CHECK(s.recorded_at_left() == 2);
  CHECK(s.fetch(2, true) == Step::on_demand);
  CHECK(s.ahead(none_gathered, 0, 0).empty());  // not following: nothing ahead
  s.end_update();  // the next window follows from the start again
  CHECK(s.fetch(0, true) == Step::followed);
}

TEST_CASE("Ahead: the next unit whatever its size, more within the bucket and the live bound", "[gather_schedule]") {
  auto s = recorded({25, 1000, 0});
  CHECK(s.fetch(0, true) == Step::followed);
  // Unit 0 is gathered (in use). Next: 1 (20) fits 25; 2 (30) would pass it.
  const auto gathered0 = [](int64_t u) { return u == 0; };
  CHECK(s.ahead(gathered0, 0, 10) == std::vector<int64_t>{1});
  // With 20 already on their way, nothing more fits the bucket...
  CHECK(s.ahead(gathered0, 20, 30).empty());
  // ...but with none on its way, the next is gathered whatever its size.
  GatherSchedule small = recorded({5, 1000, 0});
  small.fetch(0, true);
  CHECK(small.ahead(gathered0, 0, 10) == std::vector<int64_t>{1});
  // The live bound holds whatever the bucket: 10 live + 20 passes 25.
  GatherSchedule tight = recorded({1000, 25, 0});
  tight.fetch(0, true);
  CHECK(tight.ahead(gathered0, 0, 10).empty());
  // A unit the record uses twice ahead is listed once; gathered ones are skipped.
  GatherSchedule wide = recorded({1000, 1000, 0});
  wide.fetch(0, true);
  CHECK(wide.ahead(gathered0, 0, 10) == (std::vector<int64_t>{1, 2}));
  // Nothing ahead without a bucket.
  GatherSchedule off = recorded({0, 1000, 0});
  off.fetch(0, true);
  CHECK(off.ahead(none_gathered, 0, 0).empty());
}

TEST_CASE("Reuse: kept if the record uses the unit again within the distance", "[gather_schedule]") {
  auto s = recorded({1000, 1000, 35});
  for (int64_t u : {0, 1, 2}) CHECK(s.fetch(u, true) == Step::followed);
  CHECK(s.reused_soon(2));      // next in the record
  CHECK(s.reused_soon(1));      // after 30 elements of unit 2 (< 35)
  CHECK_FALSE(s.reused_soon(0));  // after 30 + 20
  auto none = recorded({1000, 1000, 0});
  none.fetch(0, true);
  CHECK_FALSE(none.reused_soon(1));  // distance 0: always released
  GatherSchedule first(kUnits, {1000, 1000, 1000}, false);
  first.fetch(0, true);
  CHECK_FALSE(first.reused_soon(0));  // while recording nothing is kept
}

TEST_CASE("ZeRO inference: each forward is a window; fetches outside one are on demand", "[gather_schedule]") {
  GatherSchedule s(kUnits, {1000, 1000, 0}, /*forward_windows=*/true);
  CHECK(s.fetch(0, true) == Step::unordered);  // outside a window
  s.begin_window();
  for (int64_t u : {0, 1, 2}) CHECK(s.fetch(u, true) == Step::recorded);
  s.end_window();
  CHECK_FALSE(s.following());
  s.begin_window();
  CHECK(s.fetch(0, true) == Step::followed);
  CHECK(s.ahead([](int64_t u) { return u == 0; }, 0, 10) == (std::vector<int64_t>{1, 2}));
  s.end_window();
  CHECK(s.windows() == 2);
}
