// Float math the CPU backend's hot loops vectorise: exp (the classifier's softmax over the
// vocabulary, attention's softmax), the logistic function (GELU's tanh form) and sums in fixed
// lanes. glibc's expf and tanhf are scalar calls, and its expf picks an FMA or an SSE2 variant at
// run time, so a loop over them neither vectorises nor computes the same bits on every CPU. These
// are plain float arithmetic (no FMA: the build has -ffp-contract=off), one rounding after each
// operation written here, so any SIMD width, or none, gives the same bits.
//
// Accuracy (tests/test_vector_math.cpp measures it against double-precision exp over every 61st
// float of the range): exp_approx within 1.5 ulp for -87.3 <= x <= 88.7 (about 1 ulp measured),
// subnormal results within 2^-149 below that, 0 below -104, +inf above 88.72 (where expf
// overflows), NaN stays NaN; logistic within 3 ulp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "core/bits.h"

namespace ptrain {
namespace vmath {

// e^x: x = n ln2 + r with |r| <= ln2 / 2 (ln2 split in two so n * ln2 loses no bits), e^r by its
// Taylor series to r^7 (truncation under 7.5e-9 relative), then scaled by 2^n in two halves so that
// results down to the subnormals and up to FLT_MAX need no special case.
inline float exp_approx(float x) {
  constexpr float kMaxArg = 88.72283935546875f;  // the smallest float whose exp overflows
  constexpr float kMinArg = -104.0f;             // below, e^x rounds to 0
  // Adding 1.5 * 2^23 rounds x / ln2 to an integer n held in the low bits of t. Outside
  // [kMinArg, kMaxArg] n is meaningless (clamped, or wrapped for |x| beyond 2^22 ln2) and the
  // result is selected below. The clamp is on the integer, not on x: a clamped x would make a
  // constant the compiler folds into a branch, which no loop vectorises.
  constexpr float kRound = 12582912.0f;
  const float t = x * 1.44269504088896341f + kRound;
  const int32_t ni = std::min(std::max(static_cast<int32_t>(float_as_bits(t) - float_as_bits(kRound)), -151), 128);
  const float n = static_cast<float>(ni);
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // 0.693359375 has 9 bits: n * it is exact
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = (p * (r * r) + r) + 1.0f;
  const int32_t half = ni >> 1;
  const float scale_lo = bits_as_float(static_cast<uint32_t>(half + 127) << 23);
  const float scale_hi = bits_as_float(static_cast<uint32_t>(ni - half + 127) << 23);
  const float e = (p * scale_hi) * scale_lo;  // NaN for NaN x, through r
  const float low = x < kMinArg ? 0.0f : e;
  return x > kMaxArg ? std::numeric_limits<float>::infinity() : low;
}

// For the element types the backend's templates run in: float takes exp_approx, double (the
// gradient checks' reference precision) the library's exp.
inline float exp(float x) { return exp_approx(x); }
inline double exp(double x) { return std::exp(x); }

// 1 / (1 + e^-x), which loses nothing where the logistic function approaches 0 or 1.
inline float logistic(float x) { return 1.0f / (1.0f + exp_approx(-x)); }
inline double logistic(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// Sums run in kLanes interleaved partial sums (element i goes to lane i % kLanes, in order), then
// the lanes in order: a summation order fixed by the definition, which the compiler maps onto
// SIMD registers of any width.
constexpr int kLanes = 16;

template <typename T>
struct LaneSum {
  T lane[kLanes] = {};
  T total() const {
    T s = 0;
    for (int j = 0; j < kLanes; ++j) s += lane[j];
    return s;
  }
};

// The two softmax passes over a row: its maximum, then the exps (in place) and their sum.
template <typename T>
T row_max(const T* row, int64_t V) {
  // Selects on values (std::max returns a reference, a select of addresses that does not vectorise).
  const auto larger = [](T a, T b) { return b > a ? b : a; };
  T lane[kLanes];
  for (int j = 0; j < kLanes; ++j) lane[j] = -INFINITY;
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes)
    for (int j = 0; j < kLanes; ++j) lane[j] = larger(lane[j], row[i + j]);
  for (int j = 0; i + j < V; ++j) lane[j] = larger(lane[j], row[i + j]);
  T m = -INFINITY;
  for (int j = 0; j < kLanes; ++j) m = larger(m, lane[j]);
  return m;
}

// Replaces row[0, V) by exp(row - maxv) and returns their sum.
template <typename T>
T exp_in_place(T* row, int64_t V, T maxv) {
  LaneSum<T> sum;
  int64_t i = 0;
  for (; i + kLanes <= V; i += kLanes)
    for (int j = 0; j < kLanes; ++j) sum.lane[j] += (row[i + j] = exp(row[i + j] - maxv));
  for (int j = 0; i + j < V; ++j) sum.lane[j] += (row[i + j] = exp(row[i + j] - maxv));
  return sum.total();
}

}  // namespace vmath
}  // namespace ptrain
