// DeepSpeed's schedules against closed forms at chosen steps (values derived in the comments).
#include <catch2/catch.hpp>

#include <cmath>

#include "core/error.h"
#include "core/optim/lr_schedule.h"

using namespace tessera::optim;

TEST_CASE("WarmupLR: log and linear warm-up, then flat", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::WarmupLR;
  o.warmup_min_lr = 0.0, o.warmup_max_lr = 0.01, o.warmup_num_steps = 100;
  LrSchedule log_schedule(o);
  CHECK(log_schedule.lr_at(-1) == 0.0);  // as built
  CHECK(log_schedule.lr_at(0) == 0.0);   // ln(1) = 0
  CHECK(log_schedule.lr_at(9) == Approx(0.01 * std::log(10.0) / std::log(100.0)));  // = 0.005
  CHECK(log_schedule.lr_at(9) == Approx(0.005));
  CHECK(log_schedule.lr_at(100) == 0.01);
  CHECK(log_schedule.lr_at(5000) == 0.01);
  o.warmup_type = WarmupType::Linear;
  o.warmup_min_lr = 0.001;
  LrSchedule linear(o);
  CHECK(linear.lr_at(25) == Approx(0.001 + 0.009 * 0.25));
  // warmup_max_lr absent: the optimizer's lr; warmup_num_steps 1 behaves as 2 (DeepSpeed's max(2, n)).
  o.warmup_max_lr.reset();
  o.base_lr = 0.02, o.warmup_num_steps = 1;
  LrSchedule short_warmup(o);
  CHECK(short_warmup.lr_at(1) == Approx(0.001 + 0.019 * 0.5));
  CHECK(short_warmup.lr_at(2) == 0.02);
}

TEST_CASE("WarmupDecayLR: linear decay to 0 at total_num_steps", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::WarmupDecayLR;
  o.warmup_min_lr = 0, o.warmup_max_lr = 0.01, o.warmup_num_steps = 100, o.total_num_steps = 200;
  o.warmup_type = WarmupType::Linear;
  LrSchedule s(o);
  CHECK(s.lr_at(50) == Approx(0.005));
  CHECK(s.lr_at(100) == Approx(0.01));        // (200 - 100) / 100
  CHECK(s.lr_at(150) == Approx(0.005));       // (200 - 150) / 100
  CHECK(s.lr_at(200) == 0.0);
  CHECK(s.lr_at(250) == 0.0);  // clamped at 0
  o.total_num_steps = 0;
  CHECK_THROWS_WITH(LrSchedule(o), Catch::Contains("scheduler.params.total_num_steps"));
}

TEST_CASE("WarmupCosineLR: ratio warm-up then cosine to cos_min_ratio", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::WarmupCosineLR;
  o.base_lr = 0.01, o.warmup_num_steps = 10, o.total_num_steps = 110, o.warmup_min_ratio = 0.1;
  o.warmup_type = WarmupType::Linear;
  LrSchedule s(o);
  CHECK(s.lr_at(-1) == 0.0);
  CHECK(s.lr_at(5) == Approx(0.01 * (0.1 + 0.5 * 0.9)));
  // it 59: progress (59 - 10 + 1) / 100 = 0.5, cosine factor 0.5 -> ratio 0.0001 + 0.9999 * 0.5.
  CHECK(s.lr_at(59) == Approx(0.01 * 0.50005));
  CHECK(s.lr_at(109) == Approx(0.01 * 0.0001));  // progress 1
  CHECK(s.lr_at(500) == Approx(0.01 * 0.0001));  // stays at the floor
}

TEST_CASE("OneCycle: triangle in lr, inverse triangle in momentum, then decay", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::OneCycle;
  o.cycle_min_lr = 0.001, o.cycle_max_lr = 0.01, o.cycle_first_step_size = 10;
  o.decay_lr_rate = 0.5, o.decay_step_size = 10;
  o.cycle_min_mom = 0.8, o.cycle_max_mom = 0.9;
  LrSchedule s(o);
  auto v = s.at(-1);
  CHECK(v.lr == 0.001);
  CHECK(*v.beta1 == 0.8);
  CHECK(*v.beta2 == 0.99);
  // it 4: batch 5 of a 20-step cycle, x = 0.25, scale 0.25 / 0.5 = 0.5.
  v = s.at(4);
  CHECK(v.lr == Approx(0.0055));
  CHECK(*v.beta1 == Approx(0.85));
  CHECK(s.lr_at(9) == Approx(0.01));  // peak: x = 0.5
  CHECK(s.lr_at(14) == Approx(0.0055));
  // decay: it 29 -> decay iteration 10, interval 1, factor 1 + 0.5.
  CHECK(s.lr_at(29) == Approx(0.001 / 1.5));
  CHECK(*s.at(29).beta1 == Approx(0.9));  // decay_mom_rate 0: momentum stays at max
  // staircase of 2 stairs on the rising half: batch 5 of 10 -> floor(1.0)/2 = 0.5; batch 4 -> 0.
  o.cycle_first_stair_count = 2;
  LrSchedule stairs(o);
  CHECK(stairs.lr_at(4) == Approx(0.0055));
  CHECK(stairs.lr_at(3) == Approx(0.001));
}

TEST_CASE("Schedules refuse bad parameters with the key path", "[optim][schedule]") {
  ScheduleOptions o;
  o.kind = ScheduleKind::WarmupLR;
  o.warmup_num_steps = 0;
  CHECK_THROWS_AS(LrSchedule(o), tessera::ConfigError);
  CHECK_THROWS_WITH(LrSchedule(o), Catch::Contains("scheduler.params.warmup_num_steps"));
  o = ScheduleOptions{};
  o.kind = ScheduleKind::OneCycle;
  o.cycle_first_step_size = 0;
  CHECK_THROWS_WITH(LrSchedule(o), Catch::Contains("cycle_first_step_size"));
  CHECK_THROWS_WITH(parse_schedule_kind("Cosine"), Catch::Contains("WarmupCosineLR"));
  CHECK(parse_schedule_kind("OneCycle") == ScheduleKind::OneCycle);
}
