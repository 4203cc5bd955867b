// Learning-rate schedules at their corners.
#include <catch2/catch.hpp>

#include "optim/schedule.h"

using namespace ptrain;

TEST_CASE("learning-rate schedules", "[optim]") {
  LrSchedule s;
  s.lr = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  CHECK(s.at(0) == Approx(0.1));  // warmup starts at lr / warmup, never at zero
  CHECK(s.at(9) == Approx(1.0));
  for (const char* decay : {"cosine", "linear"}) {
    s.decay = *parse_choice<Decay>(decay);
    CAPTURE(decay);
    CHECK(s.at(10) == Approx(1.0));
    CHECK(s.at(60) == Approx(0.55));  // halfway: both are at the midpoint
    CHECK(s.at(110) == Approx(0.1));
    CHECK(s.at(500) == Approx(0.1));
  }
  s.decay = Decay::cosine;
  CHECK(s.at(35) == Approx(0.1 + 0.45 * (1 + std::cos(M_PI * 0.25))));
  s.decay = Decay::constant;
  CHECK(s.at(100) == Approx(1.0));
  s.decay = Decay::wsd;
  s.wsd_decay_fraction = 0.2;
  CHECK(s.at(89) == Approx(1.0));   // stable until 80% of the decay phase
  CHECK(s.at(100) == Approx(0.55)); // halfway through the final 20%
  CHECK(s.at(110) == Approx(0.1));
}
