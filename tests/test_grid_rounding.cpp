// precision/grid_rounding.h, the CPU backend's vectorisable rounding, against round_to_format
// (formats.h: NVIDIA's conversions, or the portable ones tested equal to them): the same bits for
// every format and saturation mode over a strided sweep of all floats, around every rounding
// position, and on NaNs, infinities, zeros and subnormals; fp8 overflow as the casts count it.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "precision/formats.h"
#include "precision/grid_rounding.h"

using namespace ptrain;

namespace {

struct GridComparison {
  long checked = 0, mismatches = 0;
  std::string first;

  void expect_equal(const char* what, float x, float got, float want) {
    if (float_as_bits(got) == float_as_bits(want)) return;
    if (mismatches++ == 0) {
      char buf[160];
      std::snprintf(buf, sizeof buf, "%s(bits 0x%08X): grid 0x%08X, round_to_format 0x%08X", what,
                    unsigned(float_as_bits(x)), unsigned(float_as_bits(got)), unsigned(float_as_bits(want)));
      first = buf;
    }
  }

  void check(float x) {
    ++checked;
    expect_equal("bf16", x, grid::round_bf16(x), round_to_format(x, Format::bf16, false));
    expect_equal("fp16", x, grid::round_fp16(x), round_to_format(x, Format::fp16, false));
    for (bool sat : {false, true}) {
      expect_equal(sat ? "e4m3 sat" : "e4m3", x, grid::E4m3Grid::round(x, sat), round_to_format(x, Format::e4m3, sat));
      expect_equal(sat ? "e5m2 sat" : "e5m2", x, grid::E5m2Grid::round(x, sat), round_to_format(x, Format::e5m2, sat));
    }
    // Overflow as the FP8 casts count saturation: the unsaturated rounding is not finite.
    for (Format f : {Format::e4m3, Format::e5m2}) {
      const bool want = std::fabs(x) > format_max(f) && !std::isfinite(round_to_format(x, f, false));
      const bool got = f == Format::e4m3 ? grid::E4m3Grid::overflows(x) : grid::E5m2Grid::overflows(x);
      if (got != want) expect_equal(f == Format::e4m3 ? "e4m3 overflow" : "e5m2 overflow", x, got, want);
    }
    // with_rounding picks the same functions.
    for (Format f : {Format::bf16, Format::fp16, Format::e4m3, Format::e5m2})
      grid::with_rounding(f, false, [&](auto round) { expect_equal(format_name(f), x, round(x), round_to_format(x, f, false)); });
  }

  void require_none() {
    INFO(checked << " floats checked; first mismatch: " << first);
    REQUIRE(mismatches == 0);
  }
};

}  // namespace

TEST_CASE("grid rounding equals round_to_format on every 4099th float", "[formats]") {
  GridComparison c;
  for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) c.check(bits_as_float(uint32_t(b)));
  c.check(bits_as_float(0xFFFFFFFFu));
  c.require_none();
}

TEST_CASE("grid rounding equals round_to_format around every rounding position", "[formats]") {
  // Every sign, exponent and top 7 mantissa bits, times low halves at, just below and just above a
  // tie at each lower bit position, with the kept bit above it even and odd.
  std::vector<uint32_t> low = {0u, 0xFFFFu};
  for (uint32_t k = 0; k < 16; ++k)
    for (uint32_t base : {1u << k, 3u << k})
      for (uint32_t v : {base - 1, base, base + 1})
        if (v < 0x10000u) low.push_back(v);
  GridComparison c;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : low) c.check(bits_as_float((hi << 16) | lo));
  c.require_none();
}

TEST_CASE("grid rounding equals round_to_format on NaNs, infinities, zeros and subnormals", "[formats]") {
  GridComparison c;
  for (uint32_t b : {0x00000000u, 0x00000001u, 0x00000002u, 0x00400000u, 0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu,
                     0x7F800000u, 0x7F800001u, 0x7FA00000u, 0x7FC00000u, 0x7FFFFFFFu, 0x477FE000u, 0x477FF000u,
                     0x43E00000u, 0x43E80000u, 0x43F00000u, 0x47600000u, 0x47700000u})
    for (uint32_t sign : {0u, 0x80000000u}) c.check(bits_as_float(b | sign));
  c.require_none();
  CHECK(float_as_bits(grid::round_bf16(NAN)) == 0x7FFF0000u);
  CHECK(std::isinf(grid::round_fp16(65520.0f)));
  CHECK(grid::round_fp16(65519.0f) == 65504.0f);
  CHECK(grid::E4m3Grid::round(1000.0f, true) == 448.0f);
  CHECK(std::isnan(grid::E4m3Grid::round(1000.0f, false)));
  CHECK(grid::E4m3Grid::overflows(-INFINITY));
  CHECK(!grid::E4m3Grid::overflows(NAN));
}

// Every one of the 2^32 floats, in every format and saturation mode: minutes on two cores, so
// hidden from the default run; `ptrain_tests "[.exhaustive]"` runs it.
TEST_CASE("grid rounding equals round_to_format on all 2^32 floats", "[.exhaustive]") {
  long mismatches = 0;
  uint32_t first_bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(+ : mismatches)
  for (int64_t hi = 0; hi < 0x10000; ++hi) {
    GridComparison c;
    for (uint32_t lo = 0; lo < 0x10000u; ++lo) c.check(bits_as_float(uint32_t(hi << 16) | lo));
    if (c.mismatches > 0) {
#pragma omp critical
      first_bad = uint32_t(hi << 16);
    }
    mismatches += c.mismatches;
  }
  INFO("a mismatch in the 65536 floats from bits " << first_bad);
  REQUIRE(mismatches == 0);
}
