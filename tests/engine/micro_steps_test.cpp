// MicroSteps (actors/engine/micro_steps.h) on its own: which backward reduces and which step()
// updates, for accumulation, no_sync, coalesced reduction, partitioned gradients and backwards the
// engine was not told of; each expectation follows from the rules in the header.
#include <catch2/catch.hpp>

#include "actors/engine/micro_steps.h"
#include "core/error.h"

using tessera::actors::MicroSteps;

TEST_CASE("Accumulation: only the boundary backward reduces, only its step() updates", "[engine][micro]") {
  MicroSteps m(3, /*partitioned=*/false, /*distributed=*/true);
  for (int update = 0; update < 2; ++update) {
    for (int micro = 0; micro < 3; ++micro) {
      const bool last = micro == 2;
      CHECK(m.boundary() == last);
      CHECK(m.arm_backward() == last);
      if (last) {
        m.start_reduction();
        CHECK(m.reducing());
      }
      m.end_backward();
      CHECK_FALSE(m.reducing());
      CHECK(m.begin_step(false) == last);
      if (last) m.updated();
    }
  }
  CHECK(m.micro() == 6);
}

TEST_CASE("Partitioned gradients reduce at every micro-step and may reduce twice", "[engine][micro]") {
  MicroSteps m(2, /*partitioned=*/true, true);
  CHECK(m.arm_backward());
  m.start_reduction();
  m.end_backward();
  CHECK(m.arm_backward());  // a second backward in the same micro-step adds up
  m.start_reduction();
  m.end_backward();
  CHECK_FALSE(m.begin_step(false));
  CHECK(m.arm_backward());
}

TEST_CASE("A second reduction at the boundary is refused before anything changes", "[engine][micro]") {
  MicroSteps m(1, false, true);
  CHECK(m.arm_backward());
  m.start_reduction();
  m.end_backward();
  CHECK_THROWS_WITH(m.arm_backward(), Catch::Contains("called twice"));
  CHECK(m.begin_step(false));  // the refused backward left no mark: the update goes ahead
  m.updated();
  CHECK(m.arm_backward());
}

TEST_CASE("A backward the engine was not told of arms itself at its first hook", "[engine][micro]") {
  MicroSteps m(1, false, true);
  bool reduces = false;
  CHECK(m.arm_from_hook(reduces));
  CHECK(reduces);
  m.start_reduction();
  bool again = true;
  CHECK_FALSE(m.arm_from_hook(again));  // the next hooks of the same backward
  m.end_backward();
  // A second unannounced backward in the boundary micro-step is remembered and refused by step().
  CHECK(m.arm_from_hook(reduces));
  CHECK_FALSE(reduces);
  m.end_backward();
  CHECK_THROWS_WITH(m.begin_step(false), Catch::Contains("two backwards"));
  m.zero_grad();
  // fp16: an unscaled backward makes the update refuse.
  CHECK(m.arm_from_hook(reduces));
  m.start_reduction();
  m.end_backward();
  CHECK_THROWS_WITH(m.begin_step(true), Catch::Contains("did not scale"));
  CHECK(m.begin_step(false));
}

TEST_CASE("no_sync and coalesce blocks: nothing reduces inside, step() inside raises, nesting rules", "[engine][micro]") {
  MicroSteps m(1, false, true);
  m.enter_no_sync();
  CHECK_FALSE(m.arm_backward());
  m.end_backward();
  CHECK_THROWS_WITH(m.begin_step(false), Catch::Contains("inside no_sync()"));
  CHECK_THROWS_WITH(m.enter_coalesce(), Catch::Contains("nested inside no_sync"));
  m.exit_no_sync();
  CHECK(m.arm_backward());  // the first backward after the block reduces everything accumulated
  m.start_reduction();
  m.end_backward();
  CHECK(m.begin_step(false));
  m.updated();

  m.enter_coalesce();
  CHECK_THROWS_WITH(m.enter_coalesce(), Catch::Contains("already inside"));
  CHECK_THROWS_WITH(m.enter_no_sync(), Catch::Contains("inside coalesce_grad_reduction"));
  CHECK_FALSE(m.arm_backward());
  m.end_backward();
  CHECK_FALSE(m.arm_backward());
  m.end_backward();
  CHECK(m.exit_coalesce());  // one reduction of both backwards, when the block ends
  m.start_reduction();
  m.end_backward();
  CHECK(m.begin_step(false));
}

TEST_CASE("A single rank arms and counts but never marks a backward as reducing", "[engine][micro]") {
  MicroSteps m(1, false, /*distributed=*/false);
  CHECK(m.arm_backward());
  m.start_reduction();
  CHECK_FALSE(m.reducing());
  CHECK_THROWS_AS(MicroSteps(0, false, false), tessera::Error);
}
