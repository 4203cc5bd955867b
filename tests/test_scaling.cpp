// Loss scaling and FP8 delayed scaling as state machines. Every expected value below was
// worked out by hand, not recomputed with the formulas under test.
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "precision/fp8_scaling.h"
#include "precision/loss_scaler.h"

using namespace ptrain;

namespace {

const bool OK = false;
const bool INF = true;

LossScalingConfig dynamic_config(int hysteresis) {
  LossScalingConfig c;
  c.mode = LossScalingMode::dynamic;
  c.init = 8.0;
  c.growth_factor = 2.0;
  c.backoff_factor = 0.5;
  c.growth_interval = 3;
  c.hysteresis = hysteresis;
  c.min_scale = 1.0;
  return c;
}

struct Expect {
  bool nonfinite;
  double scale;
  int64_t skipped;
};

void run_sequence(LossScaler& s, const std::vector<Expect>& steps) {
  for (size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i);
    CHECK(s.update(steps[i].nonfinite) == steps[i].nonfinite);
    CHECK(s.scale() == steps[i].scale);
    CHECK(s.skipped_steps() == steps[i].skipped);
  }
}

const float NaN = std::numeric_limits<float>::quiet_NaN();
const float Inf = std::numeric_limits<float>::infinity();
const float E4M3_MAX = 448.0f;

}  // namespace

TEST_CASE("dynamic loss scaler with hysteresis 1", "[scaling]") {
  LossScaler s(dynamic_config(1));
  CHECK(s.scale() == 8.0);
  run_sequence(s, {
                      {OK, 8, 0},
                      {OK, 8, 0},
                      {OK, 16, 0},  // third finite step in a row: grow
                      {INF, 8, 1},
                      {OK, 8, 1},   // growth counter was reset by the inf
                      {INF, 4, 2},  // and reset again
                      {INF, 2, 3},
                      {INF, 1, 4},
                      {INF, 1, 5},  // 0.5 is clamped to min_scale
                      {OK, 1, 5},
                      {OK, 1, 5},
                      {OK, 2, 5},
                      {INF, 1, 6},
                  });
}

TEST_CASE("dynamic loss scaler with hysteresis 2", "[scaling]") {
  LossScaler s(dynamic_config(2));
  run_sequence(s, {
                      {INF, 8, 1},  // first inf only uses up hysteresis
                      {INF, 4, 2},  // second backs off
                      {INF, 2, 3},  // hysteresis stays exhausted: every further inf backs off
                      {OK, 2, 3},
                      {OK, 2, 3},
                      {OK, 4, 3},   // growth refills hysteresis to 2
                      {INF, 4, 4},
                      {OK, 4, 4},   // finite steps short of a growth do not refill it
                      {OK, 4, 4},
                      {INF, 2, 5},
                      {OK, 2, 5},
                      {OK, 2, 5},
                      {OK, 4, 5},
                      {INF, 4, 6},
                  });
  CHECK(s.state().hysteresis_left == 1);
  CHECK(s.state().growth_tracker == 0);
}

TEST_CASE("static and off loss scalers never change scale but skip", "[scaling]") {
  LossScalingConfig c = dynamic_config(1);
  c.mode = LossScalingMode::static_;
  LossScaler st(c);
  CHECK(st.scale() == 8.0);
  run_sequence(st, {{INF, 8, 1}, {OK, 8, 1}, {OK, 8, 1}, {OK, 8, 1}, {OK, 8, 1}, {INF, 8, 2}});

  c.mode = LossScalingMode::off;
  LossScaler off(c);
  CHECK(off.scale() == 1.0);
  run_sequence(off, {{OK, 1, 0}, {OK, 1, 0}, {OK, 1, 0}, {INF, 1, 1}, {INF, 1, 2}, {OK, 1, 2}});
}

TEST_CASE("loss scaler rejects an unknown mode", "[scaling]") {
  LossScalingConfig c;
  c.mode = LossScalingMode::auto_;  // must be resolved before reaching the scaler
  CHECK_THROWS_AS(LossScaler(c), std::logic_error);
}

TEST_CASE("loss scaler state round trip continues identically", "[scaling]") {
  LossScaler a(dynamic_config(2));
  // After: 8 (h1, skip1), ok, ok -> tracker 2, hysteresis 1, skipped 1.
  a.update(INF);
  a.update(OK);
  a.update(OK);
  const LossScaler::State st = a.state();
  CHECK(st.scale == 8.0);
  CHECK(st.growth_tracker == 2);
  CHECK(st.hysteresis_left == 1);
  CHECK(st.skipped == 1);

  LossScaler b(dynamic_config(2));
  b.restore(st);
  // One more finite step grows on both; a fresh scaler would still be at 8.
  const std::vector<Expect> rest = {{OK, 16, 1}, {INF, 16, 2}, {INF, 8, 3}, {OK, 8, 3}};
  run_sequence(a, rest);
  run_sequence(b, rest);
  CHECK(b.state().growth_tracker == a.state().growth_tracker);
  CHECK(b.state().hysteresis_left == a.state().hysteresis_left);
}

TEST_CASE("scale_from_amax corners", "[scaling]") {
  CHECK(scale_from_amax(2.0f, E4M3_MAX, 0, 3.0f) == 224.0f);
  CHECK(scale_from_amax(2.0f, E4M3_MAX, 1, 3.0f) == 112.0f);  // margin 1 halves
  CHECK(scale_from_amax(2.0f, E4M3_MAX, 2, 3.0f) == 56.0f);
  CHECK(scale_from_amax(0.0f, E4M3_MAX, 0, 3.0f) == 3.0f);
  CHECK(scale_from_amax(NaN, E4M3_MAX, 0, 3.0f) == 3.0f);
  CHECK(scale_from_amax(Inf, E4M3_MAX, 0, 3.0f) == 3.0f);
  CHECK(scale_from_amax(-Inf, E4M3_MAX, 0, 3.0f) == 3.0f);
  CHECK(scale_from_amax(0.0f, E4M3_MAX, 2, 3.0f) == 3.0f);  // margin not reapplied to previous
  CHECK(scale_from_amax(1e-45f, E4M3_MAX, 0, 3.0f) == FLT_MAX);  // 448 / 1.4e-45 overflows
  CHECK(scale_from_amax(1e-45f, E4M3_MAX, 1, 3.0f) == FLT_MAX);
}

TEST_CASE("current_scale corners", "[scaling]") {
  CHECK(current_scale(0.0f, E4M3_MAX) == 1.0f);
  CHECK(current_scale(NaN, E4M3_MAX) == 1.0f);
  CHECK(current_scale(Inf, E4M3_MAX) == 1.0f);
  CHECK(current_scale(2.0f, E4M3_MAX) == 224.0f);
  CHECK(current_scale(7.0f, 57344.0f) == 8192.0f);
  CHECK(current_scale(1e-45f, E4M3_MAX) == FLT_MAX);
}

TEST_CASE("delayed scaling with history 3 and algo max", "[scaling]") {
  DelayedScaling d(3, AmaxAlgo::max, E4M3_MAX, 0);
  CHECK(d.scale() == 1.0f);
  CHECK(d.history() == std::vector<float>{0, 0, 0});

  struct Step {
    float amax;  // 0: nothing recorded this step
    float scale;
    std::vector<float> history;
  };
  const std::vector<Step> steps = {
      {2.0f, 224.0f, {0, 0, 2}},           // max(2, 0, 0)
      {4.0f, 112.0f, {0, 2, 4}},           // max(4, 0, 2)
      {1.0f, 112.0f, {0, 4, 1}},           // max(1, 2, 4)
      {0.5f, 112.0f, {0, 1, 0.5f}},        // max(0.5, 4, 1)
      {0.5f, 448.0f, {0, 0.5f, 0.5f}},     // max(0.5, 1, 0.5): the 4 left the window
      {0.25f, 896.0f, {0, 0.5f, 0.25f}},   // max(0.25, 0.5, 0.5)
      {0.0f, 896.0f, {0, 0.25f, 0}},       // max(0, 0.5, 0.25)
      {0.0f, 1792.0f, {0, 0, 0}},          // max(0, 0.25, 0)
      {0.0f, 1792.0f, {0, 0, 0}},          // all zero: keep the scale
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i);
    const float before = d.scale();
    if (steps[i].amax > 0) d.record(steps[i].amax);
    CHECK(d.scale() == before);  // step t's own amax does not touch step t's scale
    d.end_step();
    CHECK(d.scale() == steps[i].scale);
    CHECK(d.history() == steps[i].history);
  }
}

TEST_CASE("delayed scaling takes the max of a step's records", "[scaling]") {
  DelayedScaling d(3, AmaxAlgo::max, E4M3_MAX, 0);
  d.record(1.0f);
  d.record(7.0f);
  d.record(3.5f);
  CHECK(d.history() == std::vector<float>{7, 0, 0});
  CHECK(d.scale() == 1.0f);  // the first step always casts with scale 1
  d.end_step();
  CHECK(d.scale() == 64.0f);
  CHECK(d.history() == std::vector<float>{0, 0, 7});
  d.record(1000.0f);  // huge amax in step 2 ...
  CHECK(d.scale() == 64.0f);  // ... is only seen from step 3 on
  d.end_step();
  CHECK(d.scale() == 0.448f);
}

TEST_CASE("delayed scaling most_recent uses only the last finished step", "[scaling]") {
  DelayedScaling d(3, AmaxAlgo::most_recent, E4M3_MAX, 0);
  d.record(2.0f);
  d.end_step();
  CHECK(d.scale() == 224.0f);
  CHECK(d.history() == std::vector<float>{0, 0, 2});
  d.record(4.0f);
  d.end_step();
  CHECK(d.scale() == 112.0f);
  CHECK(d.history() == std::vector<float>{0, 2, 4});
  d.record(1.0f);
  d.end_step();
  CHECK(d.scale() == 448.0f);  // the 4 still in the window is ignored
  CHECK(d.history() == std::vector<float>{0, 4, 1});
  d.end_step();  // zero-amax step keeps the scale
  CHECK(d.scale() == 448.0f);
  CHECK(d.history() == std::vector<float>{0, 1, 0});
}

TEST_CASE("delayed scaling with margin 2 and history 1", "[scaling]") {
  for (AmaxAlgo algo : {AmaxAlgo::max, AmaxAlgo::most_recent}) {
    DelayedScaling d(1, algo, E4M3_MAX, 2);
    d.record(7.0f);
    d.end_step();
    CHECK(d.scale() == 16.0f);  // 448 / 7 / 4
    CHECK(d.history() == std::vector<float>{0});
    d.end_step();
    CHECK(d.scale() == 16.0f);  // zero step: kept, margin not applied again
    d.record(0.5f);
    d.end_step();
    CHECK(d.scale() == 224.0f);  // 448 / 0.5 / 4: with history 1 the old 7 is gone
  }
}

TEST_CASE("delayed scaling NaN and inf amax keep the scale", "[scaling]") {
  SECTION("NaN is sticky within a step whatever the order") {
    DelayedScaling d(3, AmaxAlgo::max, E4M3_MAX, 0);
    d.record(1.0f);
    d.record(NaN);
    CHECK(std::isnan(d.history()[0]));
    DelayedScaling e(3, AmaxAlgo::max, E4M3_MAX, 0);
    e.record(NaN);
    e.record(1.0f);
    CHECK(std::isnan(e.history()[0]));
  }
  SECTION("algo max: the scale is frozen while the NaN is in the window") {
    DelayedScaling d(3, AmaxAlgo::max, E4M3_MAX, 0);
    d.record(2.0f);
    d.end_step();
    CHECK(d.scale() == 224.0f);
    d.record(NaN);
    d.end_step();
    CHECK(d.scale() == 224.0f);
    CHECK(d.history()[1] == 2.0f);
    CHECK(std::isnan(d.history()[2]));
    d.record(4.0f);
    d.end_step();
    CHECK(d.scale() == 224.0f);
    CHECK(std::isnan(d.history()[1]));
    d.record(1.0f);
    d.end_step();
    CHECK(d.scale() == 224.0f);  // NaN was in slot 1 at this end_step
    CHECK(d.history() == std::vector<float>{0, 4, 1});
    d.record(1.0f);
    d.end_step();
    CHECK(d.scale() == 112.0f);  // max(1, 4, 1)
  }
  SECTION("most_recent: only the NaN step keeps the scale") {
    DelayedScaling d(3, AmaxAlgo::most_recent, E4M3_MAX, 0);
    d.record(2.0f);
    d.end_step();
    d.record(NaN);
    d.end_step();
    CHECK(d.scale() == 224.0f);
    d.record(4.0f);
    d.end_step();
    CHECK(d.scale() == 112.0f);
  }
  SECTION("inf") {
    DelayedScaling d(1, AmaxAlgo::max, E4M3_MAX, 0);
    d.record(2.0f);
    d.end_step();
    d.record(Inf);
    CHECK(d.history()[0] == Inf);
    d.end_step();
    CHECK(d.scale() == 224.0f);
  }
}

TEST_CASE("delayed scaling restore round trip", "[scaling]") {
  DelayedScaling a(3, AmaxAlgo::max, E4M3_MAX, 0);
  a.record(4.0f);
  a.end_step();
  a.record(1.0f);
  a.end_step();
  CHECK(a.scale() == 112.0f);
  CHECK(a.history() == std::vector<float>{0, 4, 1});

  DelayedScaling b(3, AmaxAlgo::max, E4M3_MAX, 0);
  b.restore(a.history(), a.scale());
  const std::vector<float> amaxes = {0.5f, 0.5f, 0.25f};
  const std::vector<float> scales = {112.0f, 448.0f, 896.0f};
  for (size_t i = 0; i < amaxes.size(); ++i) {
    CAPTURE(i);
    a.record(amaxes[i]);
    b.record(amaxes[i]);
    a.end_step();
    b.end_step();
    CHECK(a.scale() == scales[i]);
    CHECK(b.scale() == scales[i]);
    CHECK(b.history() == a.history());
  }
  CHECK_THROWS_AS(b.restore({0, 0}, 1.0f), std::logic_error);
  CHECK_THROWS_AS(DelayedScaling(0, AmaxAlgo::max, E4M3_MAX, 0), std::logic_error);
}
