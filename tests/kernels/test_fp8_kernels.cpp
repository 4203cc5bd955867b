// FP8 kernels under the SIMT emulator against the CPU backend's FP8 emulation and ptrain's
// scaling recipes. Everything here is compared bit for bit: codes, dequantised values, amax,
// scales and the telemetry counts.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "backend/cuda/kernel_formats.h"
#include "fp8.cuh"
#include "kernel_test.h"
#include "precision/fp8_scaling.h"

namespace ptrain::test {
namespace {

using kernels::fp8;

const Format kFp8Formats[] = {Format::e4m3, Format::e5m2};

struct Shape {
  int rows, cols;
};

// Normal values on the storage grid with zeros, values that saturate either FP8 format and
// values that underflow both, once scaled by kCastScale.
constexpr float kCastScale = 37.5f;
std::vector<float> cast_input(size_t n, uint64_t seed, Format storage) {
  std::vector<float> x = random_on_grid(n, seed, 4.0f, storage);
  for (size_t i = 0; i < n; ++i) {
    const float sign = i % 2 ? -1.0f : 1.0f;
    if (i % 11 == 1) x[i] = 0.0f;
    else if (i % 13 == 3) x[i] = round_to_format(sign * 3e4f, storage, false);
    else if (i % 17 == 5) x[i] = round_to_format(sign * 1e-7f, storage, false);
  }
  return x;
}

// What a cast must reproduce: the CPU backend's dequantised output and statistics, and the
// codes of x * scale.
struct CastReference {
  std::vector<float> dequantised;
  std::vector<fp8> codes;
  Fp8CastStats stats;
};
CastReference cast_reference(std::vector<float>& x, int rows, int cols, Format f, float scale) {
  CastReference ref;
  ref.dequantised.assign(x.size(), 0.0f);
  CpuReference cpu;
  ref.stats = cpu->fp8_cast(cpu.view(ref.dequantised, {rows, cols}), cpu.view(x, {rows, cols}), f, scale);
  for (const float v : x) ref.codes.push_back(fp8_bits(v * scale, f, true));
  return ref;
}

// Decodes codes and multiplies by scale_inv, as the CPU backend dequantises (q * (1 / scale)).
std::vector<float> dequantise(const std::vector<fp8>& codes, Format f, float scale_inv) {
  std::vector<float> out(codes.size());
  for (size_t i = 0; i < codes.size(); ++i) out[i] = fp8_value(codes[i], f) * scale_inv;
  return out;
}

std::vector<fp8> transposed(const std::vector<fp8>& a, int rows, int cols) {
  std::vector<fp8> t(a.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) t[static_cast<size_t>(c) * rows + r] = a[static_cast<size_t>(r) * cols + c];
  return t;
}

void expect_same_amax(const std::string& what, float got, float ref) {
  expect_identical(what, std::vector<float>{got}, std::vector<float>{ref});
}

void expect_same_counts(const kernels::Fp8Counts& got, const Fp8CastStats& ref) {
  CHECK(got.nonzero == static_cast<unsigned long long>(ref.nonzero));
  CHECK(got.underflow == static_cast<unsigned long long>(ref.underflow));
  CHECK(got.saturated == static_cast<unsigned long long>(ref.saturated));
}

// Runs fp8_cast on storage `x` (rows, cols) in every variant (flat or transposing, full or
// capped grid) and every thread order, against `ref`.
template <typename T>
void check_cast(const std::vector<T>& x, const Shape s, Format f, float scale, const CastReference& ref) {
  const size_t n = static_cast<size_t>(s.rows) * s.cols;
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    for (const bool transpose : {false, true})
      for (const int max_blocks : {kernels::kFp8MaxBlocks, 3}) {
        INFO(format_name(f) << " rows=" << s.rows << " cols=" << s.cols << (transpose ? " transposed" : "")
                            << " max_blocks=" << max_blocks << " order " << order.name());
        auto out = poisoned<fp8>(n), out_t = poisoned<fp8>(n);
        float got_amax = 0.0f;
        kernels::Fp8Counts counts{};
        kernels::fp8_cast(out.data(), transpose ? out_t.data() : nullptr, &got_amax, &counts, x.data(), s.rows, s.cols,
                          &scale, fp8_interpretation(f), nullptr, max_blocks);
        expect_identical("fp8_cast codes", out, ref.codes);
        expect_identical("fp8_cast dequantised", dequantise(out, f, 1.0f / scale), ref.dequantised);
        expect_same_amax("fp8_cast amax", got_amax, ref.stats.amax);
        expect_same_counts(counts, ref.stats);
        if (transpose) expect_identical("fp8_cast transposed codes", out_t, transposed(out, s.rows, s.cols));
      }
  }
}

TEMPLATE_TEST_CASE("fp8_cast kernel matches the CPU backend's cast bit for bit", "[kernels][fp8]", float, bf16, fp16) {
  constexpr Format storage = format_of<TestType>();
  // Odd sizes, tiles ragged in both directions, and a GPT-2 124M activation slice (64 x 768).
  const std::vector<Shape> shapes{{1, 1}, {1, 7}, {7, 19}, {19, 7}, {111, 33}, {3, 769}, {129, 130}, {64, 768}};
  for (const Format f : kFp8Formats)
    for (const Shape s : shapes) {
      const size_t n = static_cast<size_t>(s.rows) * s.cols;
      std::vector<float> x = cast_input(n, 21, storage);
      const CastReference ref = cast_reference(x, s.rows, s.cols, f, kCastScale);
      if (n >= 64) {  // the inputs exercise every count
        REQUIRE(ref.stats.saturated > 0);
        REQUIRE(ref.stats.underflow > 0);
        REQUIRE(ref.stats.nonzero < static_cast<int64_t>(n));
      }
      check_cast(to_storage<TestType>(x), s, f, kCastScale, ref);
    }
}

// The weight's transpose is made from its codes when the dgrad GEMM needs it: every byte must
// land at its transposed place, on ragged tiles and unaligned rows too, and nothing else written.
TEST_CASE("fp8_transpose kernel transposes codes byte for byte", "[kernels][fp8]") {
  const std::vector<Shape> shapes{{1, 1}, {1, 17}, {17, 1}, {7, 19}, {65, 63}, {64, 128}, {129, 130}, {3, 769}};
  for (const Shape s : shapes) {
    const size_t n = static_cast<size_t>(s.rows) * s.cols;
    std::vector<fp8> codes(n);
    // Every byte value but the poison's 0xFF, so that a code left unwritten shows.
    for (size_t i = 0; i < n; ++i) codes[i] = static_cast<fp8>((i * 37 + i / 251) % 255);
    for (const auto& order : simt::test_orders()) {
      simt::ScopedOptions use(order);
      for (const int max_blocks : {kernels::kFp8MaxBlocks, 2}) {
        INFO("rows=" << s.rows << " cols=" << s.cols << " max_blocks=" << max_blocks << " order " << order.name());
        auto out = poisoned<fp8>(n + 16);  // 16 bytes past the end must stay poisoned
        const std::vector<fp8> tail(out.end() - 16, out.end());
        kernels::fp8_transpose(out.data(), codes.data(), s.rows, s.cols, nullptr, max_blocks);
        expect_identical("transposed codes", std::vector<fp8>(out.begin(), out.begin() + static_cast<long>(n)),
                         transposed(codes, s.rows, s.cols));
        expect_identical("bytes past the transpose", std::vector<fp8>(out.end() - 16, out.end()), tail);
      }
    }
  }
}

TEMPLATE_TEST_CASE("fp8_cast kernel reports a NaN amax and saturates infinity", "[kernels][fp8]", float, bf16, fp16) {
  constexpr Format storage = format_of<TestType>();
  const Shape s{7, 19};
  for (const Format f : kFp8Formats)
    for (const float special : {NAN, INFINITY, -INFINITY}) {
      std::vector<float> x = cast_input(static_cast<size_t>(s.rows) * s.cols, 22, storage);
      x[20] = round_to_format(special, storage, false);
      const CastReference ref = cast_reference(x, s.rows, s.cols, f, kCastScale);
      if (std::isnan(special)) REQUIRE(std::isnan(ref.stats.amax));
      else REQUIRE(ref.stats.amax == INFINITY);
      INFO("special value " << special);
      check_cast(to_storage<TestType>(x), s, f, kCastScale, ref);
    }
}

TEMPLATE_TEST_CASE("amax kernel matches the CPU backend", "[kernels][fp8]", float, bf16, fp16) {
  constexpr Format storage = format_of<TestType>();
  std::vector<size_t> sizes(odd_sizes().begin(), odd_sizes().end());
  sizes.push_back(64 * 768);
  for (const size_t n : sizes)
    for (const bool with_nan : {false, true}) {
      std::vector<float> x = random_on_grid(n, 31, 3.0f, storage);
      x[n / 2] = round_to_format(-25.0f, storage, false);  // the largest magnitude is negative
      if (with_nan) x[n - 1] = NAN;
      CpuReference cpu;
      const float ref = cpu->amax(cpu.view(x, {static_cast<int64_t>(n)}));
      REQUIRE(std::isnan(ref) == with_nan);
      const auto d_x = to_storage<TestType>(x);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        for (const int max_blocks : {kernels::kFp8MaxBlocks, 2}) {
          INFO("n=" << n << (with_nan ? " with NaN" : "") << " max_blocks=" << max_blocks << " order " << order.name());
          float got = 0.0f;
          kernels::amax(&got, d_x.data(), n, nullptr, max_blocks);
          expect_same_amax("amax", got, ref);
          // amax accumulates over a step's casts: a larger earlier value stays.
          float running = 1e30f;
          kernels::amax(&running, d_x.data(), n, nullptr, max_blocks);
          expect_same_amax("running amax", running, with_nan ? ref : 1e30f);
        }
      }
    }
}

TEST_CASE("current_scale_from_amax kernel matches ptrain::current_scale", "[kernels][fp8]") {
  const float amaxes[] = {0.0f, NAN, INFINITY, 1e-40f, 1e-30f, 3.7e-3f, 1.0f, 448.0f, 57344.0f, 1e38f};
  for (const Format f : kFp8Formats)
    for (const float a : amaxes) {
      const float ref = current_scale(a, format_max(f));
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO(format_name(f) << " amax " << a << " order " << order.name());
        std::vector<float> scale = poisoned<float>(1), scale_inv = poisoned<float>(1);
        kernels::current_scale_from_amax(scale.data(), scale_inv.data(), &a, format_max(f), nullptr);
        expect_identical("current scale", scale, std::vector<float>{ref});
        expect_identical("current scale_inv", scale_inv, std::vector<float>{1.0f / ref});
      }
    }
}

TEST_CASE("set_scale kernel writes the scale and its reciprocal", "[kernels][fp8]") {
  for (const float value : {1.0f, 37.5f, 3.0f, 1e-30f, FLT_MAX}) {
    INFO("scale " << value);
    std::vector<float> scale = poisoned<float>(1), scale_inv = poisoned<float>(1);
    kernels::set_scale(scale.data(), scale_inv.data(), value, nullptr);
    expect_identical("scale", scale, std::vector<float>{value});
    expect_identical("scale_inv", scale_inv, std::vector<float>{1.0f / value});
  }
}

// Block-scaling input: a different range in every row (so blocks get different scales), small
// values beside large ones in a block (underflow), one all-zero block (scale 1), and optionally
// a NaN (which the block amax skips but the tensor amax reports).
std::vector<float> block_input(const Shape s, int block_rows, int block_cols, Format storage, bool with_nan) {
  const size_t n = static_cast<size_t>(s.rows) * s.cols;
  std::vector<float> x = random_on_grid(n, 41, 1.0f, storage);
  for (int r = 0; r < s.rows; ++r)
    for (int c = 0; c < s.cols; ++c) {
      float& v = x[static_cast<size_t>(r) * s.cols + c];
      v = round_to_format(std::ldexp(v, (r % 7) * 3 - 9 - (c % 37 == 2 ? 20 : 0)), storage, false);
      if (r < block_rows && c >= block_cols && c < 2 * block_cols) v = 0.0f;
    }
  if (with_nan) x[n / 2] = NAN;
  return x;
}

TEMPLATE_TEST_CASE("fp8_quantize_blocks kernel matches the CPU backend's block cast bit for bit", "[kernels][fp8]", float,
                   bf16, fp16) {
  constexpr Format storage = format_of<TestType>();
  const std::vector<Shape> shapes{{1, 1}, {7, 19}, {111, 200}, {129, 257}, {256, 768}};
  const Shape block_shapes[] = {{1, 128}, {128, 128}};
  for (const Format f : kFp8Formats)
    for (const Shape b : block_shapes)
      for (const Shape s : shapes) {
        if (f == Format::e5m2 && s.rows == 256) continue;  // the block recipe's GPT-2 shape is E4M3 (as in TE)
        const size_t n = static_cast<size_t>(s.rows) * s.cols;
        const bool with_nan = s.rows == 111;
        std::vector<float> x = block_input(s, b.rows, b.cols, storage, with_nan);
        std::vector<float> ref_out(n);
        CpuReference cpu;
        const Fp8CastStats stats =
            cpu->fp8_cast_blocks(cpu.view(ref_out, {s.rows, s.cols}), cpu.view(x, {s.rows, s.cols}), f, b.rows, b.cols);
        REQUIRE(std::isnan(stats.amax) == with_nan);
        // Each block's scale from its amax (NaN skipped, as the CPU's std::max does), and the codes.
        const BlockReference blocks = block_reference(x, s.rows, s.cols, b.rows, b.cols, f);
        const std::vector<float>& ref_scale_inv = blocks.scale_inv;
        const std::vector<fp8>& ref_codes = blocks.codes;
        const auto d_x = to_storage<TestType>(x);
        for (const auto& order : simt::test_orders()) {
          simt::ScopedOptions use(order);
          for (const int max_blocks : {kernels::kFp8MaxBlocks, 3}) {
            INFO(format_name(f) << " blocks " << b.rows << "x" << b.cols << " rows=" << s.rows << " cols=" << s.cols
                                << " max_blocks=" << max_blocks << " order " << order.name());
            auto out = poisoned<fp8>(n);
            auto scale_inv = poisoned<float>(ref_scale_inv.size());
            float got_amax = 0.0f;
            kernels::Fp8Counts counts{};
            kernels::fp8_quantize_blocks(out.data(), scale_inv.data(), &got_amax, &counts, d_x.data(), s.rows, s.cols,
                                         b.rows, b.cols, fp8_interpretation(f), nullptr, max_blocks);
            expect_identical("block codes", out, ref_codes);
            expect_identical("block scale_inv", scale_inv, ref_scale_inv);
            std::vector<float> dequantised(n);
            for (int r = 0; r < s.rows; ++r)
              for (int c = 0; c < s.cols; ++c) {
                const size_t i = static_cast<size_t>(r) * s.cols + c;
                dequantised[i] = fp8_value(out[i], f) * scale_inv[blocks.block_of(r, c)];
              }
            expect_identical("block dequantised", dequantised, ref_out);
            expect_same_amax("block cast amax", got_amax, stats.amax);
            expect_same_counts(counts, stats);
          }
        }
      }
}

// The layouts the native block-scaled GEMMs read: codes transposed, and the factors scattered
// by a BlockScaleLayout (here column-major with padding, so a wrong stride lands elsewhere).
// Column tiles with only a transposed output run their own kernel. Factors the layout leaves
// out stay poisoned; codes, factors, amax and counts equal the row-major cast's.
TEMPLATE_TEST_CASE("fp8_quantize_blocks_into writes transposed codes and factors in the GEMMs' layouts",
                   "[kernels][fp8]", float, bf16, fp16) {
  constexpr Format storage = format_of<TestType>();
  constexpr Format f = Format::e4m3;
  // Ragged everywhere; then two whole block rows with ragged columns (16-byte transposed stores).
  const std::vector<Shape> shapes{{1, 1}, {7, 19}, {129, 257}, {256, 160}};
  // transposed_factors_only: the weight's cast, whose transposed codes fp8_transpose makes later.
  struct Case {
    Shape block;
    bool codes, transposed, transposed_factors_only;
  };
  const Case cases[] = {{{1, 128}, true, false, false},
                        {{128, 128}, true, true, false},
                        {{128, 128}, true, false, true},
                        {{128, 1}, false, true, false},
                        {{128, 1}, true, true, false}};
  for (const Case& k : cases)
    for (const Shape s : shapes) {
      const size_t n = static_cast<size_t>(s.rows) * s.cols;
      std::vector<float> x = block_input(s, k.block.rows, k.block.cols, storage, /*with_nan=*/s.rows == 7);
      const BlockReference ref = block_reference(x, s.rows, s.cols, k.block.rows, k.block.cols, f);
      const int tile_rows = (s.rows + k.block.rows - 1) / k.block.rows, tile_cols = ref.tile_cols;
      const kernels::BlockScaleLayout layout{1, tile_rows + 1}, layout_t{1, tile_rows + 3};
      const size_t factors = static_cast<size_t>(tile_rows + 3) * tile_cols;
      std::vector<float> stats_out(n);
      CpuReference cpu;
      const Fp8CastStats stats = cpu->fp8_cast_blocks(cpu.view(stats_out, {s.rows, s.cols}), cpu.view(x, {s.rows, s.cols}),
                                                      f, k.block.rows, k.block.cols);
      const auto d_x = to_storage<TestType>(x);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        for (const int max_blocks : {kernels::kFp8MaxBlocks, 2}) {
          INFO("blocks " << k.block.rows << "x" << k.block.cols << " codes " << k.codes << " transposed " << k.transposed
                         << " transposed factors only " << k.transposed_factors_only
                         << " rows=" << s.rows << " cols=" << s.cols << " max_blocks=" << max_blocks << " order "
                         << order.name());
          auto codes = poisoned<fp8>(n), codes_t = poisoned<fp8>(n);
          auto scale_inv = poisoned<float>(factors), scale_inv_t = poisoned<float>(factors);
          kernels::Fp8BlockCodes dst;
          if (k.codes) {
            dst.codes = codes.data();
            dst.scale_inv = scale_inv.data();
            dst.layout = layout;
          }
          if (k.transposed || k.transposed_factors_only) {
            dst.codes_t = k.transposed ? codes_t.data() : nullptr;
            dst.scale_inv_t = scale_inv_t.data();
            dst.layout_t = layout_t;
          }
          float got_amax = 0.0f;
          kernels::Fp8Counts counts{};
          kernels::fp8_quantize_blocks_into(dst, &got_amax, &counts, d_x.data(), s.rows, s.cols, k.block.rows,
                                            k.block.cols, fp8_interpretation(f), nullptr, max_blocks);
          // The expected arrays: each block's factor at its place in the layout, the rest poisoned.
          const auto expected_factors = [&](const kernels::BlockScaleLayout& l) {
            std::vector<float> want = poisoned<float>(factors);
            for (int i = 0; i < tile_rows; ++i)
              for (int j = 0; j < tile_cols; ++j)
                want[static_cast<size_t>(i) * l.row_stride + static_cast<size_t>(j) * l.col_stride] =
                    ref.scale_inv[static_cast<size_t>(i) * tile_cols + j];
            return want;
          };
          if (k.codes) {
            expect_identical("codes", codes, ref.codes);
            expect_identical("factors", scale_inv, expected_factors(layout));
          }
          if (k.transposed) {
            std::vector<fp8> want_t(n);
            for (int r = 0; r < s.rows; ++r)
              for (int c = 0; c < s.cols; ++c)
                want_t[static_cast<size_t>(c) * s.rows + r] = ref.codes[static_cast<size_t>(r) * s.cols + c];
            expect_identical("transposed codes", codes_t, want_t);
            expect_identical("transposed factors", scale_inv_t, expected_factors(layout_t));
          }
          if (k.transposed_factors_only) {
            expect_identical("transposed codes left alone", codes_t, poisoned<fp8>(n));
            expect_identical("transposed factors", scale_inv_t, expected_factors(layout_t));
          }
          expect_same_amax("amax", got_amax, stats.amax);
          expect_same_counts(counts, stats);
        }
      }
    }
}

// A weight cast in parts, as ranks cast their shards' parts of a primary FP8 weight: the cuts
// fall anywhere (inside rows and blocks). Each part's block amaxes (the kernel's and the CPU
// backend's) merged by max, the scales from them, then each part encoded: the codes, the
// dequantised values and the summed counts equal the whole tensor's block cast, bit for bit; with
// one scale, the per-tensor cast's.
TEMPLATE_TEST_CASE("a weight cast in parts with agreed scales equals the whole tensor's cast bit for bit",
                   "[kernels][fp8]", float, bf16) {
  constexpr Format storage = format_of<TestType>();
  constexpr Format f = Format::e4m3;
  const std::vector<Shape> shapes{{7, 19}, {129, 257}, {256, 160}};
  const Shape block_shapes[] = {{4, 8}, {128, 128}};
  for (const Shape b : block_shapes)
    for (const Shape s : shapes) {
      const size_t n = static_cast<size_t>(s.rows) * s.cols;
      const std::vector<size_t> cuts{0, n / 3 + 5, n / 3 + 6, 2 * n / 3 + 1, n};  // one part of a single element
      // A NaN, which the block amaxes skip and the per-tensor cast keeps.
      std::vector<float> x = block_input(s, b.rows, b.cols, storage, /*with_nan=*/s.rows == 129);
      std::vector<float> ref_out(n);
      CpuReference cpu;
      const Fp8CastStats stats =
          cpu->fp8_cast_blocks(cpu.view(ref_out, {s.rows, s.cols}), cpu.view(x, {s.rows, s.cols}), f, b.rows, b.cols);
      const BlockReference blocks = block_reference(x, s.rows, s.cols, b.rows, b.cols, f);
      const CastReference tensor_ref = cast_reference(x, s.rows, s.cols, f, kCastScale);
      const auto d_x = to_storage<TestType>(x);
      const size_t block_count = blocks.scale_inv.size();
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO("blocks " << b.rows << "x" << b.cols << " rows=" << s.rows << " cols=" << s.cols << " order " << order.name());
        std::vector<float> amaxes(block_count, 0.0f), cpu_amaxes(block_count, 0.0f);
        for (size_t k = 0; k + 1 < cuts.size(); ++k) {
          const int64_t first = static_cast<int64_t>(cuts[k]), len = static_cast<int64_t>(cuts[k + 1] - cuts[k]);
          const int64_t base = first / s.cols / b.rows * blocks.tile_cols;
          kernels::fp8_block_amax_part(amaxes.data() + base, base, d_x.data() + first, static_cast<size_t>(len), first,
                                       s.cols, b.rows, b.cols, nullptr, 3);
          cpu->fp8_block_amaxes(cpu_amaxes.data(), cpu.view(x, {s.rows, s.cols}).range(first, len), first, s.cols, b.rows,
                                b.cols);
        }
        std::vector<float> scales, factors, cpu_factors;
        for (const float a : amaxes) scales.push_back(current_scale(a, format_max(f)));
        for (const float scale : scales) factors.push_back(1.0f / scale);
        for (const float a : cpu_amaxes) cpu_factors.push_back(1.0f / current_scale(a, format_max(f)));
        expect_identical("factors from the parts' amaxes", factors, blocks.scale_inv);
        expect_identical("factors from the CPU's parts' amaxes", cpu_factors, blocks.scale_inv);
        for (const bool one_scale : {false, true}) {
          const std::vector<float> used = one_scale ? std::vector<float>{kCastScale} : scales;
          auto codes = poisoned<fp8>(n);
          auto values = poisoned<float>(n);
          std::vector<float> cpu_values(n);
          kernels::Fp8Counts counts{}, value_counts{};
          Fp8CastStats cpu_stats;
          float amax = 0.0f;
          for (size_t k = 0; k + 1 < cuts.size(); ++k) {
            const int64_t first = static_cast<int64_t>(cuts[k]), len = static_cast<int64_t>(cuts[k + 1] - cuts[k]);
            kernels::fp8_encode_part(codes.data() + first, nullptr, &amax, &counts, d_x.data() + first,
                                     static_cast<size_t>(len), first, s.cols, used.data(), static_cast<int>(used.size()),
                                     b.rows, b.cols, fp8_interpretation(f), nullptr, 3);
            kernels::fp8_encode_part<TestType>(nullptr, values.data() + first, &amax, &value_counts, d_x.data() + first,
                                               static_cast<size_t>(len), first, s.cols, used.data(),
                                               static_cast<int>(used.size()), b.rows, b.cols, fp8_interpretation(f),
                                               nullptr);
            cpu_stats.merge(cpu->fp8_encode(cpu.view(cpu_values, {s.rows, s.cols}).range(first, len),
                                            cpu.view(x, {s.rows, s.cols}).range(first, len), f, used, first, s.cols,
                                            b.rows, b.cols));
          }
          INFO((one_scale ? "one scale" : "block scales"));
          expect_identical("codes", codes, one_scale ? tensor_ref.codes : blocks.codes);
          expect_identical("dequantised", values, one_scale ? tensor_ref.dequantised : ref_out);
          expect_identical("the CPU's dequantised", cpu_values, one_scale ? tensor_ref.dequantised : ref_out);
          const Fp8CastStats& whole = one_scale ? tensor_ref.stats : stats;
          expect_same_counts(counts, whole);
          expect_same_counts(value_counts, whole);
          CHECK(cpu_stats.nonzero == whole.nonzero);
          CHECK(cpu_stats.underflow == whole.underflow);
          CHECK(cpu_stats.saturated == whole.saturated);
        }
      }
    }
}

}  // namespace
}  // namespace ptrain::test
