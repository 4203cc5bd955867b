// What every kernel test shares. A kernel runs under the SIMT emulator on host memory holding
// its storage type (float, bf16, fp16), and its result is compared with the CPU backend's op on
// the same values (inputs are drawn on the format's grid, so both see identical numbers).
//
// Rules the helpers enforce: every kernel runs under every thread order of simt::test_orders();
// outputs are poisoned with NaN before each launch (poison()); NaN never passes expect_close;
// tolerances depend on the format (README, "CUDA kernels, checked without a GPU").
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "common.cuh"
#include "precision/formats.h"
#include "precision/fp8_scaling.h"
#include "simt.h"
#include "test_util.h"
#include "tolerances.h"

namespace ptrain::test {

using kernels::bf16;
using kernels::fp16;

// Odd sizes catch tail bugs that powers of two hide.
inline const std::vector<int>& odd_sizes() {
  static const std::vector<int> sizes{1, 7, 19, 111, 769};
  return sizes;
}

template <typename T>
constexpr Format format_of() {
  if constexpr (std::is_same<T, bf16>::value) return Format::bf16;
  else if constexpr (std::is_same<T, fp16>::value) return Format::fp16;
  else return Format::fp32;
}


// Normal(0, scale) values rounded to format f: the kernel's storage and the CPU reference's
// floats then hold exactly the same numbers.
inline std::vector<float> random_on_grid(size_t n, uint64_t seed, float scale, Format f) {
  std::vector<float> v(n);
  Rng rng(seed, 0x6b65726e);
  for (auto& x : v) x = round_to_format(static_cast<float>(rng.normal() * scale), f, false);
  return v;
}

template <typename T>
std::vector<T> to_storage(const std::vector<float>& v) {
  std::vector<T> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::from_float<T>(v[i]);
  return out;
}

template <typename T>
std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = kernels::to_float(v[i]);
  return out;
}

// 0xFF bytes: NaN in float, bf16, fp16, e4m3 and e5m2 alike.
template <typename T>
void poison(std::vector<T>& v) {
  std::memset(static_cast<void*>(v.data()), 0xFF, v.size() * sizeof(T));
}
template <typename T>
std::vector<T> poisoned(size_t n) {
  std::vector<T> v(n);
  poison(v);
  return v;
}

// A flat length and where the operands start in their buffers: offsets that are not a multiple
// of the 16-byte vector make the pointers unaligned, as views into the middle of a buffer are.
struct FlatCase {
  size_t n;
  int in_offset, out_offset;
};
// Odd lengths with aligned and unaligned inputs and outputs, then one aligned `large` case.
inline std::vector<FlatCase> flat_cases(size_t large) {
  std::vector<FlatCase> cases;
  const int offsets[][2] = {{0, 0}, {1, 0}, {0, 3}};
  for (const int n : odd_sizes())
    for (const auto& o : offsets) cases.push_back({static_cast<size_t>(n), o[0], o[1]});
  cases.push_back({large, 0, 0});
  return cases;
}

// Block scaling as the CPU backend does it: for x (rows, cols) in blocks of block_rows x
// block_cols, each block's index, its scale_inv (1 / current_scale of the block's amax, NaN
// skipped as the CPU's std::max does) and every element's code.
struct BlockReference {
  int block_rows, block_cols, tile_cols;
  std::vector<float> scale_inv;   // (ceil(rows / block_rows), tile_cols), row-major
  std::vector<kernels::fp8> codes;
  size_t block_of(int r, int c) const { return static_cast<size_t>(r / block_rows) * tile_cols + c / block_cols; }
};
inline BlockReference block_reference(const std::vector<float>& x, int rows, int cols, int block_rows, int block_cols,
                                      Format f) {
  BlockReference b{block_rows, block_cols, (cols + block_cols - 1) / block_cols, {}, {}};
  std::vector<float> amax(static_cast<size_t>((rows + block_rows - 1) / block_rows) * b.tile_cols, 0.0f);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      float& a = amax[b.block_of(r, c)];
      a = std::max(a, std::fabs(x[static_cast<size_t>(r) * cols + c]));
    }
  for (const float a : amax) b.scale_inv.push_back(1.0f / current_scale(a, format_max(f)));
  b.codes.resize(x.size());
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r) * cols + c;
      b.codes[i] = fp8_bits(x[i] * current_scale(amax[b.block_of(r, c)], format_max(f)), f, /*saturate=*/true);
    }
  return b;
}

// The CPU backend as the reference, single-threaded (its results do not depend on threads).
struct CpuReference {
  std::unique_ptr<Backend> backend = make_cpu_backend(1);
  Backend* operator->() { return backend.get(); }
  // Views host floats as a tensor on format f's grid.
  static Tensor view(std::vector<float>& v, std::vector<int64_t> shape, Format f = Format::fp32) {
    Tensor t(v.data(), DType::f32, shape);
    t.format = f;
    return t;
  }
  static Tensor tokens(std::vector<int32_t>& v, std::vector<int64_t> shape) { return Tensor(v.data(), DType::i32, shape); }
};

// Appends "kernel<TAB>format<TAB>relative error" to the file named by PTRAIN_KERNEL_ERRORS,
// from which scripts/kernel-report.sh builds the worst error per kernel and precision.
inline void record_error(const std::string& what, Format f, double err) {
  const char* path = std::getenv("PTRAIN_KERNEL_ERRORS");
  if (!path || !*path) return;
  if (FILE* out = std::fopen(path, "a")) {
    std::fprintf(out, "%s\t%s\t%.3e\n", what.c_str(), format_name(f), err);
    std::fclose(out);
  }
}

// Checks a kernel's output against the reference within the format's tolerance (tests/tolerances.h:
// the aggregate, or `tol` in its place, and each element).
inline void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& ref, Format f,
                         double tol = -1) {
  Tolerance bound = op_tolerance(f);
  if (tol >= 0) bound.rel_l2 = tol;
  const double err = relative_error(got, ref);
  record_error(what, f, err);
  const ElementMismatches bad = element_mismatches(got, ref, bound);
  INFO(what << " (" << format_name(f) << "): relative error " << err << "; " << bad.count << " of " << got.size()
            << " elements outside their bound" << (bad.count ? ", the worst " + bad.worst : std::string()));
  CHECK(err <= bound.rel_l2);
  CHECK(bad.count == 0);
}

// Checks bit-for-bit equality (casts, codes, scales); NaN equals only the same NaN bits.
template <typename T>
void expect_identical(const std::string& what, const std::vector<T>& got, const std::vector<T>& ref) {
  REQUIRE(got.size() == ref.size());
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &ref[i], sizeof(T)) != 0 && mismatches++ == 0) first = i;
  INFO(what << ": " << mismatches << " of " << got.size() << " elements differ, first at " << first);
  CHECK(mismatches == 0);
}

}  // namespace ptrain::test
