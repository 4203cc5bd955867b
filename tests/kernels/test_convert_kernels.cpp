// Conversion, GEMM-finishing, FP8 dequantisation and double-sum kernels (kernels/convert.cuh,
// kernels/reduce.cuh) under the SIMT emulator against ptrain::round_to_format and the CPU
// backend. Casts, GEMM tails and dequantised values are compared bit for bit; the double sums
// within 1e-12 relative, with the same bits in every thread order.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <iterator>
#include <limits>
#include <type_traits>

#include "backend/cuda/kernel_formats.h"
#include "convert.cuh"
#include "kernel_test.h"
#include "precision/fp8_scaling.h"
#include "reduce.cuh"

namespace ptrain::test {
namespace {

using kernels::fp8;

const Format kAllFormats[] = {Format::fp32, Format::bf16, Format::fp16, Format::e4m3, Format::e5m2};
const Format kFp8Formats[] = {Format::e4m3, Format::e5m2};
constexpr size_t kGpt2Activation = 64 * 768;  // 64 rows of GPT-2 124M's 768 channels

uint32_t bits_of(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}
uint64_t bits_of(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// `values` in storage type T, starting `offset` elements into a buffer with one spare element
// after them (filled with 0xFF bytes, like the prefix).
template <typename T>
std::vector<T> at_offset(const std::vector<float>& values, int offset) {
  std::vector<T> buffer = poisoned<T>(values.size() + offset + 1);
  for (size_t i = 0; i < values.size(); ++i) buffer[offset + i] = kernels::from_float<T>(values[i]);
  return buffer;
}

// n elements of a buffer from `offset` on.
template <typename T>
std::vector<T> slice(const std::vector<T>& buffer, int offset, size_t n) {
  return std::vector<T>(buffer.begin() + offset, buffer.begin() + offset + static_cast<std::ptrdiff_t>(n));
}

// Whether the elements around [offset, offset + n) of a buffer from at_offset / poisoned still
// hold their 0xFF bytes: a kernel wrote nothing outside its output.
template <typename T>
bool surroundings_untouched(const std::vector<T>& buffer, int offset, size_t n) {
  const auto poison = poisoned<T>(1);
  for (size_t i = 0; i < buffer.size(); ++i) {
    if (i >= static_cast<size_t>(offset) && i < static_cast<size_t>(offset) + n) continue;
    if (std::memcmp(&buffer[i], &poison[0], sizeof(T)) != 0) return false;
  }
  return true;
}

std::string describe(const FlatCase& s, const simt::Options& order) {
  return "n=" + std::to_string(s.n) + " input offset " + std::to_string(s.in_offset) + " output offset " +
         std::to_string(s.out_offset) + " order " + order.name();
}

// Values over a wide range (2^-20 to 2^20 times a normal) and, every fifth element, a special
// one: NaN, infinities, signed zeros, float subnormals, and values at and beyond the largest of
// each format (ties to an overflow included), so every rounding path is taken.
std::vector<float> convert_input(size_t n, uint64_t seed) {
  const float specials[] = {NAN,     INFINITY, -INFINITY, 0.0f,    -0.0f, 65504.0f, 65520.0f, -7e4f,  448.0f,
                            464.0f,  -500.0f,  57344.0f,  61440.0f, 1e5f, 1e-8f,    -3e-5f,   1e-40f, 3.4e38f};
  Rng rng(seed, 0x636f6e76);
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) {
    if (i % 5 == 2)
      x[i] = specials[(i / 5) % std::size(specials)];
    else
      x[i] = std::ldexp(static_cast<float>(rng.normal()), static_cast<int>(i % 41) - 20);
  }
  return x;
}

// ---------------------------------------------------------------------------- round_to_format

TEST_CASE("kernels::round_to_format matches ptrain::round_to_format bit for bit", "[kernels][convert]") {
  std::vector<float> values = convert_input(4096, 1);
  Rng rng(2, 0x726f756e);
  for (int i = 0; i < (1 << 18); ++i) {  // random bit patterns: every exponent, NaN payloads, subnormals
    const auto bits = static_cast<uint32_t>(rng.next_u64());
    float x;
    std::memcpy(&x, &bits, sizeof x);
    values.push_back(x);
  }
  for (const Format f : kAllFormats) {
    size_t mismatches = 0;
    float first = 0.0f;
    for (const float x : values) {
      const float got = kernels::round_to_format(x, round_format(f));
      if (bits_of(got) != bits_of(round_to_format(x, f, /*saturate=*/false)) && mismatches++ == 0) first = x;
    }
    INFO(format_name(f) << ": " << mismatches << " of " << values.size() << " values differ, first " << first);
    CHECK(mismatches == 0);
  }
}

// ---------------------------------------------------------------------------- convert

// kernels::convert from Src to Dst, rounding to every format, against ptrain::round_to_format
// and the CPU backend's copy() into a tensor of that format, then Dst's own rounding.
template <typename Dst, typename Src>
void check_convert() {
  for (const FlatCase& s : flat_cases(kGpt2Activation)) {
    const size_t n = s.n;
    const auto src = at_offset<Src>(convert_input(n, 3), s.in_offset);
    std::vector<float> held = to_floats(slice(src, s.in_offset, n));  // what Src holds
    CpuReference cpu;
    for (const Format f : kAllFormats) {
      std::vector<float> rounded(n), copied(n);
      for (size_t i = 0; i < n; ++i) rounded[i] = round_to_format(held[i], f, /*saturate=*/false);
      cpu->copy(cpu.view(copied, {static_cast<int64_t>(n)}, f), cpu.view(held, {static_cast<int64_t>(n)}));
      expect_identical("CPU copy against round_to_format", copied, rounded);
      const std::vector<Dst> ref = to_storage<Dst>(copied);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO(format_name(format_of<Src>()) << " to " << format_name(format_of<Dst>()) << " rounded to "
                                           << format_name(f) << " " << describe(s, order));
        auto out = poisoned<Dst>(n + s.out_offset + 1);
        kernels::convert(out.data() + s.out_offset, src.data() + s.in_offset, n, round_format(f), nullptr);
        expect_identical("convert", slice(out, s.out_offset, n), ref);
        CHECK(surroundings_untouched(out, s.out_offset, n));
        if constexpr (std::is_same<Dst, Src>::value) {  // rounding in place
          auto buffer = src;
          kernels::convert(buffer.data() + s.in_offset, buffer.data() + s.in_offset, n, round_format(f), nullptr);
          expect_identical("convert in place", slice(buffer, s.in_offset, n), ref);
          CHECK(surroundings_untouched(buffer, s.in_offset, n));
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("convert kernel to float matches the CPU backend's copy bit for bit", "[kernels][convert]", float,
                   bf16, fp16) {
  check_convert<float, TestType>();
}

TEMPLATE_TEST_CASE("convert kernel to bf16 matches the CPU backend's copy bit for bit", "[kernels][convert]", float,
                   bf16, fp16) {
  check_convert<bf16, TestType>();
}

TEMPLATE_TEST_CASE("convert kernel to fp16 matches the CPU backend's copy bit for bit", "[kernels][convert]", float,
                   bf16, fp16) {
  check_convert<fp16, TestType>();
}

// ---------------------------------------------------------------------------- gemm_finish

struct GemmShape {
  int rows, cols;
};
// Odd sizes, ragged vectors in every row, and a GPT-2 124M projection output (64 x 768).
const std::vector<GemmShape> kGemmShapes{{1, 1}, {1, 7}, {7, 19}, {19, 111}, {3, 769}, {64, 768}};

// kernels::gemm_finish into Dst with a Bias bias (or none) against the scalar float chain
// v = acc; v = old + v (accumulating); v += bias; out = v rounded once to Dst.
template <typename Dst, typename Bias>
void check_gemm_finish(bool with_bias) {
  for (const GemmShape s : kGemmShapes)
    for (const bool accumulate : {false, true}) {
      const size_t n = static_cast<size_t>(s.rows) * s.cols;
      const std::vector<float> acc = random_on_grid(n, 11, 3.0f, Format::fp32);  // FP32 products: off any grid
      const std::vector<float> old = random_on_grid(n, 12, 1.0f, format_of<Dst>());
      const std::vector<float> bias = random_on_grid(s.cols, 13, 0.5f, format_of<Bias>());
      std::vector<Dst> ref(n);
      for (int r = 0; r < s.rows; ++r)
        for (int c = 0; c < s.cols; ++c) {
          const size_t i = static_cast<size_t>(r) * s.cols + c;
          float v = acc[i];
          if (accumulate) v = old[i] + v;
          if (with_bias) v += bias[c];
          ref[i] = kernels::from_float<Dst>(v);
        }
      const auto d_bias = to_storage<Bias>(bias);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO(format_name(format_of<Dst>()) << " output, "
                                           << (with_bias ? format_name(format_of<Bias>()) : "no") << " bias, rows="
                                           << s.rows << " cols=" << s.cols << (accumulate ? " accumulating" : "")
                                           << " order " << order.name());
        auto out = accumulate ? to_storage<Dst>(old) : poisoned<Dst>(n);
        kernels::gemm_finish<Dst, Bias>(out.data(), acc.data(), with_bias ? d_bias.data() : nullptr, s.rows, s.cols,
                                        accumulate, nullptr);
        expect_identical("gemm_finish", out, ref);
      }
    }
}

TEMPLATE_TEST_CASE("gemm_finish kernel adds the product and the bias in the CPU's order bit for bit",
                   "[kernels][convert]", float, bf16, fp16) {
  check_gemm_finish<TestType, TestType>(false);
  check_gemm_finish<TestType, float>(true);
  check_gemm_finish<TestType, bf16>(true);
  check_gemm_finish<TestType, fp16>(true);
}

// ---------------------------------------------------------------------------- FP8 dequantisation

// Normal values with zeros, NaN, infinities, values that saturate either format and values that
// underflow both, once scaled by kCastScale.
constexpr float kCastScale = 37.5f;  // not a power of two: 1 / scale is rounded
std::vector<float> dequant_input(size_t n, uint64_t seed) {
  std::vector<float> x = random_on_grid(n, seed, 4.0f, Format::fp32);
  const float specials[] = {0.0f, NAN, INFINITY, -INFINITY, 3e4f, -3e4f, 1e-7f, -1e-7f};
  for (size_t i = 2; i < n; i += 7) x[i] = specials[(i / 7) % std::size(specials)];
  return x;
}

TEMPLATE_TEST_CASE("fp8_dequantize kernel matches the CPU backend's fp8_cast output bit for bit", "[kernels][convert]",
                   float, bf16, fp16) {
  for (const Format f : kFp8Formats)
    for (const FlatCase& s : flat_cases(kGpt2Activation)) {
      const size_t n = s.n;
      std::vector<float> x = dequant_input(n, 21);
      std::vector<float> cpu_out(n);
      CpuReference cpu;
      const int64_t len = static_cast<int64_t>(n);
      cpu->fp8_cast(cpu.view(cpu_out, {len}), cpu.view(x, {len}), f, kCastScale);
      std::vector<fp8> codes = poisoned<fp8>(n + s.in_offset + 1);
      for (size_t i = 0; i < n; ++i) codes[s.in_offset + i] = fp8_bits(x[i] * kCastScale, f, /*saturate=*/true);
      const std::vector<TestType> ref = to_storage<TestType>(cpu_out);
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO(format_name(f) << " " << describe(s, order));
        auto out = poisoned<TestType>(n + s.out_offset + 1);
        kernels::fp8_dequantize(out.data() + s.out_offset, codes.data() + s.in_offset, n, 1.0f / kCastScale,
                                fp8_interpretation(f), nullptr);
        expect_identical("fp8_dequantize", slice(out, s.out_offset, n), ref);
        CHECK(surroundings_untouched(out, s.out_offset, n));
      }
    }
}

// A different range in every row (so blocks get different scales), a tiny value beside large
// ones (underflow) and an all-zero first block (scale 1).
std::vector<float> block_input(const GemmShape s, int block_rows, int block_cols) {
  std::vector<float> x = random_on_grid(static_cast<size_t>(s.rows) * s.cols, 41, 1.0f, Format::fp32);
  for (int r = 0; r < s.rows; ++r)
    for (int c = 0; c < s.cols; ++c) {
      float& v = x[static_cast<size_t>(r) * s.cols + c];
      v = std::ldexp(v, (r % 7) * 3 - 9 - (c % 37 == 2 ? 20 : 0));
      if (r < block_rows && c < block_cols && (s.rows > block_rows || s.cols > block_cols)) v = 0.0f;
    }
  return x;
}

TEMPLATE_TEST_CASE("fp8_dequantize_blocks kernel matches the CPU backend's fp8_cast_blocks output bit for bit",
                   "[kernels][convert]", float, bf16, fp16) {
  const GemmShape block_shapes[] = {{1, 128}, {128, 128}, {2, 5}};
  for (const Format f : kFp8Formats)
    for (const GemmShape b : block_shapes)
      for (const GemmShape s : kGemmShapes) {
        const size_t n = static_cast<size_t>(s.rows) * s.cols;
        std::vector<float> x = block_input(s, b.rows, b.cols);
        std::vector<float> cpu_out(n);
        CpuReference cpu;
        cpu->fp8_cast_blocks(cpu.view(cpu_out, {s.rows, s.cols}), cpu.view(x, {s.rows, s.cols}), f, b.rows, b.cols);
        // Each block's scale from its amax, as the CPU backend computes it, and the codes.
        const BlockReference blocks = block_reference(x, s.rows, s.cols, b.rows, b.cols, f);
        const std::vector<float>& scale_inv = blocks.scale_inv;
        const std::vector<fp8>& codes = blocks.codes;
        const std::vector<TestType> ref = to_storage<TestType>(cpu_out);
        for (const auto& order : simt::test_orders()) {
          simt::ScopedOptions use(order);
          INFO(format_name(f) << " blocks " << b.rows << "x" << b.cols << " rows=" << s.rows << " cols=" << s.cols
                              << " order " << order.name());
          auto out = poisoned<TestType>(n);
          kernels::fp8_dequantize_blocks(out.data(), codes.data(), scale_inv.data(), s.rows, s.cols, b.rows, b.cols,
                                         fp8_interpretation(f), nullptr);
          expect_identical("fp8_dequantize_blocks", out, ref);
        }
      }
}

// ---------------------------------------------------------------------------- double sums

// Runs double_sum (sum and sum of squares, the full grid and a grid capped at 3 blocks so the
// grid-stride loop runs) in every thread order; each result within 1e-12 relative of the CPU's
// (an infinite reference exactly, a NaN one by a NaN) and with the same bits in every order.
template <typename T>
void check_double_sum(const std::vector<float>& x, const std::string& what) {
  const size_t n = x.size();
  std::vector<float> v = x;
  CpuReference cpu;
  const double ref_sum = cpu->sum(cpu.view(v, {static_cast<int64_t>(n)}));
  const double ref_squares = cpu->sum_squares(cpu.view(v, {static_cast<int64_t>(n)}));
  const auto d_x = to_storage<T>(x);
  for (const bool squares : {false, true})
    for (const int max_partials : {kernels::kReducePartials, 3}) {
      const double ref = squares ? ref_squares : ref_sum;
      bool have_first = false;
      uint64_t first_bits = 0;
      for (const auto& order : simt::test_orders()) {
        simt::ScopedOptions use(order);
        INFO(what << " n=" << n << (squares ? " sum of squares" : " sum") << " max_partials=" << max_partials
                  << " order " << order.name());
        double out = std::numeric_limits<double>::quiet_NaN();
        auto partials = poisoned<double>(kernels::kReducePartials);
        kernels::double_sum(&out, partials.data(), d_x.data(), n, squares, nullptr, max_partials);
        INFO("kernel " << out << " reference " << ref);
        if (std::isnan(ref)) {
          CHECK(std::isnan(out));
        } else if (std::isinf(ref)) {
          CHECK(out == ref);
        } else {
          CHECK(std::fabs(out - ref) <= 1e-12 * std::fabs(ref));  // NaN fails
        }
        // The grid never exceeds its cap: partial sums past it are never written.
        const int blocks = kernels::double_sum_blocks<T>(n, max_partials);
        CHECK(blocks <= max_partials);
        CHECK(surroundings_untouched(partials, 0, static_cast<size_t>(blocks)));
        // The summation order is fixed by n alone: the same bits whatever the thread order.
        if (!have_first) {
          first_bits = bits_of(out);
          have_first = true;
        }
        CHECK(bits_of(out) == first_bits);
      }
    }
}

TEMPLATE_TEST_CASE("double_sum kernels match the CPU backend's sum and sum_squares", "[kernels][reduce]", float, bf16,
                   fp16) {
  constexpr Format f = format_of<TestType>();
  std::vector<size_t> sizes(odd_sizes().begin(), odd_sizes().end());
  sizes.push_back(kGpt2Activation);
  for (const size_t n : sizes) {
    std::vector<float> x = random_on_grid(n, 51, 2.0f, f);
    for (auto& v : x) v = round_to_format(v + 0.3f, f, false);  // a non-zero mean: the sum is not ~0
    check_double_sum<TestType>(x, format_name(f));
  }
  // An empty tensor sums to +0.
  double out = std::numeric_limits<double>::quiet_NaN();
  auto partials = poisoned<double>(kernels::kReducePartials);
  kernels::double_sum<TestType>(&out, partials.data(), nullptr, 0, false, nullptr);
  CHECK(bits_of(out) == bits_of(0.0));
}

TEMPLATE_TEST_CASE("double_sum kernels propagate inf and NaN as the CPU backend does", "[kernels][reduce]", float, bf16,
                   fp16) {
  constexpr Format f = format_of<TestType>();
  struct Special {
    const char* name;
    float a, b;  // b: a second special value, or 0 for none
  };
  const Special specials[] = {{"inf", INFINITY, 0.0f},
                              {"-inf", -INFINITY, 0.0f},
                              {"NaN", NAN, 0.0f},
                              {"inf and -inf", INFINITY, -INFINITY}};
  // One block, and several (4099 elements: 3 to 5 blocks of partial sums, or a capped grid).
  for (const size_t n : {size_t{769}, size_t{4099}})
    for (const Special& sp : specials)
      for (const size_t at : {size_t{0}, n / 2, n - 1}) {
        std::vector<float> x = random_on_grid(n, 52, 1.0f, f);
        x[at] = round_to_format(sp.a, f, false);
        if (sp.b != 0.0f) x[(at + n / 3) % n] = round_to_format(sp.b, f, false);
        check_double_sum<TestType>(x, std::string(format_name(f)) + " with " + sp.name + " at " + std::to_string(at));
      }
}

// The backend's grid: a GPT-2 124M attention projection weight (768 x 768 floats) needs more
// than kReducePartials blocks, so the first stage runs exactly kReducePartials, each striding.
TEST_CASE("double_sum kernel caps its grid at kReducePartials blocks", "[kernels][reduce]") {
  static_assert(kernels::kReducePartials == 264, "the fixed first-stage grid of the sums");
  constexpr size_t n = size_t{768} * 768;
  REQUIRE(kernels::double_sum_blocks<float>(n, kernels::kReducePartials) == kernels::kReducePartials);
  std::vector<float> x = random_on_grid(n, 53, 1.0f, Format::fp32);
  for (auto& value : x) value += 0.25f;  // a non-zero mean
  std::vector<float> v = x;
  CpuReference cpu;
  const double ref = cpu->sum(cpu.view(v, {static_cast<int64_t>(n)}));
  bool have_first = false;
  uint64_t first_bits = 0;
  for (const auto& order : simt::test_orders()) {
    simt::ScopedOptions use(order);
    INFO("order " << order.name());
    double out = std::numeric_limits<double>::quiet_NaN();
    auto partials = poisoned<double>(kernels::kReducePartials);
    kernels::double_sum(&out, partials.data(), x.data(), n, false, nullptr);
    CHECK(std::fabs(out - ref) <= 1e-12 * std::fabs(ref));
    if (!have_first) {
      first_bits = bits_of(out);
      have_first = true;
    }
    CHECK(bits_of(out) == first_bits);
  }
}

}  // namespace
}  // namespace ptrain::test
