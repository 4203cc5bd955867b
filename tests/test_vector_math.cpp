// backend/cpu/vector_math.h: the CPU backend's exp and logistic against double-precision
// references over every 61st float of their ranges (the error bound the header states), the
// range ends, and the fixed-lane sums and softmax passes against their definitions.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backend/cpu/vector_math.h"
#include "core/rng.h"

using namespace ptrain;

namespace {

// Distance in units in the last place of the float nearest `want`.
double ulps(float got, double want) {
  const float nearest = static_cast<float>(want);
  const double ulp = std::nextafter(nearest, std::numeric_limits<float>::infinity()) - nearest;
  return std::fabs(static_cast<double>(got) - want) / ulp;
}

}  // namespace

TEST_CASE("exp_approx is within 1.5 ulp of exp from -87.3 to 88.7", "[vector_math]") {
  double worst = 0;
  float worst_x = 0;
  // Every 61st float bit pattern between the range ends, both signs.
  for (uint32_t sign : {0u, 0x80000000u}) {
    const float end = sign ? -87.3f : 88.7f;
    for (uint32_t b = 0; b <= float_as_bits(std::fabs(end)); b += 61) {
      const float x = bits_as_float(b | sign);
      const double e = ulps(vmath::exp_approx(x), std::exp(static_cast<double>(x)));
      if (e > worst) worst = e, worst_x = x;
    }
  }
  INFO("worst " << worst << " ulp at x = " << worst_x);
  CHECK(worst <= 1.5);
}

TEST_CASE("exp_approx at the ends of its range", "[vector_math]") {
  // Subnormal results, down to where e^x rounds to 0: within the smallest subnormal.
  for (float x = -87.3f; x >= -104.0f; x -= 0.0137f)
    CHECK(std::fabs(vmath::exp_approx(x) - std::exp(static_cast<double>(x))) <= std::ldexp(1.0, -149));
  CHECK(vmath::exp_approx(-104.5f) == 0.0f);
  CHECK(vmath::exp_approx(-1e30f) == 0.0f);
  CHECK(vmath::exp_approx(-INFINITY) == 0.0f);
  CHECK(std::isfinite(vmath::exp_approx(88.7228f)));
  CHECK(vmath::exp_approx(88.7229f) == INFINITY);
  CHECK(vmath::exp_approx(1e30f) == INFINITY);
  CHECK(vmath::exp_approx(INFINITY) == INFINITY);
  CHECK(std::isnan(vmath::exp_approx(NAN)));
  CHECK(vmath::exp_approx(0.0f) == 1.0f);
}

TEST_CASE("logistic is accurate where it approaches 0 and 1", "[vector_math]") {
  double worst = 0;
  for (float x = -80.0f; x <= 80.0f; x += 0.00731f) {
    const double want = 1.0 / (1.0 + std::exp(-static_cast<double>(x)));
    worst = std::max(worst, ulps(vmath::logistic(x), want));
  }
  INFO("worst " << worst << " ulp");
  CHECK(worst <= 3.0);
  CHECK(vmath::logistic(-200.0f) == 0.0f);
  CHECK(vmath::logistic(200.0f) == 1.0f);
}

TEST_CASE("softmax passes: the row's max, and exps summed lane by lane as defined", "[vector_math]") {
  for (int64_t V : {1, 15, 16, 17, 50257}) {
    CAPTURE(V);
    std::vector<float> row(static_cast<size_t>(V));
    Rng rng(static_cast<uint64_t>(V));
    for (float& x : row) x = 8.0f * (rng.uniform() - 0.5f);
    const float maxv = vmath::row_max(row.data(), V);
    float want_max = -INFINITY;
    for (float x : row) want_max = std::max(want_max, x);
    CHECK(maxv == want_max);
    // The definition: element i into lane i % 16, in order; then the lanes in order.
    float lane[vmath::kLanes] = {};
    std::vector<float> want_row(row.size());
    for (int64_t i = 0; i < V; ++i) lane[i % vmath::kLanes] += (want_row[i] = vmath::exp_approx(row[i] - maxv));
    float want_sum = 0;
    for (float l : lane) want_sum += l;
    const float sum = vmath::exp_in_place(row.data(), V, maxv);
    CHECK(sum == want_sum);
    CHECK(row == want_row);
  }
}
