// The fp16 loss scaler against DeepSpeed's dynamic rules, step by step (expected values derived
// in the comments).
#include <catch2/catch.hpp>

#include "core/error.h"
#include "core/optim/loss_scaler.h"

using namespace tessera::optim;

TEST_CASE("Dynamic loss scale: hysteresis, halving, growth after the window", "[optim][fp16]") {
  LossScalerOptions o;
  o.initial_scale = 65536, o.scale_window = 2, o.hysteresis = 2;
  LossScaler s(o);
  auto u = s.update(true);  // it 0: overflow, hysteresis 2 -> 1, scale stays
  CHECK(u.skipped);
  CHECK(s.scale() == 65536);
  CHECK(u.describe().find("hysteresis left 1") != std::string::npos);
  u = s.update(true);  // it 1: overflow with hysteresis 1 -> halve
  CHECK(s.scale() == 32768);
  CHECK(u.describe().find("65536 -> 32768") != std::string::npos);
  s.update(false);  // it 2: stable interval (2 - 1) - 1 = 0: no growth
  CHECK(s.scale() == 32768);
  s.update(false);  // it 3: interval 1
  CHECK(s.scale() == 32768);
  s.update(false);  // it 4: interval 2 = window -> double, hysteresis refilled
  CHECK(s.scale() == 65536);
  CHECK(s.skipped_steps() == 2);
  s.update(true);  // hysteresis was refilled to 2: no halving on the first overflow
  CHECK(s.scale() == 65536);
}

TEST_CASE("Loss scale never drops below the minimum, and overflow there is an error", "[optim][fp16]") {
  LossScalerOptions o;
  o.initial_scale = 4, o.min_scale = 2, o.hysteresis = 1;
  LossScaler s(o);
  s.update(true);
  CHECK(s.scale() == 2);
  CHECK_THROWS_WITH(s.update(true), Catch::Contains("minimum loss scale 2"));
  CHECK(s.scale() == 2);
  CHECK(s.skipped_steps() == 1);
  o.raise_error_at_min_scale = false;
  LossScaler lenient(o);
  lenient.update(true);
  lenient.update(true);
  CHECK(lenient.scale() == 2);
}

TEST_CASE("Static loss scale never moves but still counts skipped steps", "[optim][fp16]") {
  LossScalerOptions o;
  o.dynamic = false, o.static_scale = 128;
  LossScaler s(o);
  s.update(true);
  for (int i = 0; i < 5; ++i) s.update(false);
  CHECK(s.scale() == 128);
  CHECK(s.skipped_steps() == 1);
}

TEST_CASE("Loss scaler options are validated with fp16 key names", "[optim][fp16]") {
  LossScalerOptions o;
  o.scale_window = 0;
  CHECK_THROWS_WITH(LossScaler(o), Catch::Contains("fp16.loss_scale_window"));
}

TEST_CASE("Hysteresis 0, as DeepSpeed takes it: overflows skip steps and never lower the scale", "[optim][fp16]") {
  // DeepSpeed halves only when the hysteresis left is 1; from 0 it counts down past 1: 0, -1, -2.
  LossScalerOptions o;
  o.initial_scale = 1024, o.scale_window = 1000, o.hysteresis = 0;
  LossScaler s(o);
  for (int i = 0; i < 3; ++i) {
    const auto u = s.update(true);
    CHECK(u.skipped);
    CHECK(u.scale == 1024);
  }
  CHECK(s.skipped_steps() == 3);
}
