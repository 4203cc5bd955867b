// The CPU backend's reduced-precision passes: rounding op outputs to their format's grid (with
// the gradient counters), FP8 casts with their statistics, amax. Rounding goes through
// precision/grid_rounding.h, which gives round_to_format's bits in loops that vectorise.
#pragma once

#include <cmath>
#include <cstdint>

#include "backend/backend.h"
#include "backend/cpu/layer_ops.h"
#include "precision/fp8_scaling.h"
#include "precision/grid_rounding.h"

namespace ptrain {
namespace cpu {

// Rounds x[0, n) with `round` and counts, among the values it changed, the nonzero ones and those
// it flushed to zero. Values already on the grid (untouched rows of an accumulating gradient) are
// not counted. The tests are on the bits (g++ vectorises the loop only so): x != 0, r != x (bits
// differ, or x is NaN) and r == 0, as floats compare.
template <typename Round>
void round_in_place(float* x, int64_t n, Round round, int64_t* nonzero_changed, int64_t* underflow) {
  int64_t changed = 0, flushed = 0;
#pragma omp parallel for schedule(static) reduction(+ : changed, flushed) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    const float r = round(x[i]);
    const uint32_t u = float_as_bits(x[i]), ru = float_as_bits(r);
    const bool nonzero = (u << 1) != 0;
    changed += nonzero & ((ru != u) | ((u & 0x7FFFFFFFu) > grid::kInf));
    flushed += nonzero & ((ru << 1) == 0);
    x[i] = r;
  }
  *nonzero_changed = changed;
  *underflow = flushed;
}

// The same for format f (not fp32), unsaturated as op outputs are.
inline void round_in_place(float* x, int64_t n, Format f, int64_t* nonzero_changed, int64_t* underflow) {
  grid::with_rounding(f, /*saturate=*/false, [&](auto round) { round_in_place(x, n, round, nonzero_changed, underflow); });
}

inline float amax(const float* x, int64_t n) {
  float m = 0;
  bool nan = false;
#pragma omp parallel for schedule(static) reduction(max : m) reduction(|| : nan) if (worth_threads(n))
  for (int64_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = std::max(m, std::fabs(x[i]));
  }
  return nan ? NAN : m;
}

// Casts one run of elements with one scale (out = fp8(in * scale) * (1 / scale), saturating);
// adds to `stats` (amax is the caller's).
template <typename Grid>
void fp8_cast_run(float* out, const float* in, int64_t n, float scale, Fp8CastStats& stats) {
  const float inv = 1.0f / scale;
  int64_t nonzero = 0, underflow = 0, saturated = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = in[i], scaled = x * scale;
    const float y = Grid::round(scaled, /*saturate=*/true) * inv;
    out[i] = y;
    // Counted on the bits, as in round_in_place. y is 0 exactly when the fp8 value is: the
    // smallest fp8 subnormal (2^-16) times inv stays a nonzero float while scale < 2^133, and inv
    // is finite while scale >= 2^-128 (below, every y is NaN or inf, as q * inv always was).
    const bool x_nonzero = (float_as_bits(x) << 1) != 0;
    nonzero += x_nonzero;
    underflow += x_nonzero & ((float_as_bits(y) << 1) == 0);
    saturated += Grid::overflows(scaled);  // clipped: beyond what rounding would bring back to max
  }
  stats.nonzero += nonzero;
  stats.underflow += underflow;
  stats.saturated += saturated;
}

inline void fp8_cast_run(float* out, const float* in, int64_t n, Format f, float scale, Fp8CastStats& stats) {
  if (f == Format::e4m3)
    fp8_cast_run<grid::E4m3Grid>(out, in, n, scale, stats);
  else
    fp8_cast_run<grid::E5m2Grid>(out, in, n, scale, stats);
}

}  // namespace cpu
}  // namespace ptrain
