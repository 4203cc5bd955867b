// How far an op's result may lie from the CPU reference, per storage format: one table for the
// kernel tests (tests/kernels, under the SIMT emulator) and the CUDA backend's op tests
// (tests/gpu, on the simulated device and on a GPU). Two checks, both applied:
//   aggregate    ||got - ref|| / ||ref|| <= rel_l2
//   per element  |got[i] - ref[i]| <= element_rel * |ref[i]| + rel_l2 * max|ref|
// The aggregate alone lets one bad element hide among many good ones (one bf16 element off by a
// whole unit in a 64 x 768 layernorm output moves it by about 0.0045, well inside 1e-2); the
// per-element bound catches it, while its floor (the aggregate bound at the tensor's largest
// value) lets elements near zero carry the rounding of the larger terms summed into them.
#pragma once

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ptrain::test {

struct Tolerance {
  double rel_l2;       // the aggregate bound
  double element_rel;  // each element's, relative to its own reference value
};

// FP32 arithmetic differs from the reference only in summation order; a reduced format may land a
// unit or two in the last place away (bf16 keeps 8 significant bits, fp16 11).
inline Tolerance op_tolerance(Format f) {
  switch (f) {
    case Format::fp32: return {1e-5, 1e-4};
    case Format::fp16: return {2e-3, std::ldexp(1.0, -8)};
    default: return {1e-2, std::ldexp(1.0, -6)};
  }
}
inline double tolerance(Format f) { return op_tolerance(f).rel_l2; }

// The elements outside the per-element bound: their count and the worst few, each with its
// position and both values (empty when all pass). NaN in either never passes.
struct ElementMismatches {
  size_t count = 0;
  std::string worst;  // "at 17: 1.25 vs 0.25 (|diff| 1 > bound 0.0123); ..."
};
inline ElementMismatches element_mismatches(const std::vector<float>& got, const std::vector<float>& ref,
                                            const Tolerance& tol) {
  ElementMismatches out;
  if (got.size() != ref.size()) {
    out.count = std::max(got.size(), ref.size());
    out.worst = "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(ref.size());
    return out;
  }
  double largest = 0;
  for (const float r : ref) largest = std::max(largest, std::fabs(static_cast<double>(r)));
  const double floor = tol.rel_l2 * largest;
  std::vector<std::pair<double, size_t>> bad;  // (excess over the bound, position)
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double bound = tol.element_rel * std::fabs(static_cast<double>(ref[i])) + floor;
    if (!(diff <= bound)) bad.push_back({std::isnan(diff) ? INFINITY : diff - bound, i});
  }
  out.count = bad.size();
  std::sort(bad.begin(), bad.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::ostringstream text;
  for (size_t k = 0; k < bad.size() && k < 3; ++k) {
    const size_t i = bad[k].second;
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    text << (k ? "; " : "") << "at " << i << ": " << got[i] << " vs " << ref[i] << " (|diff| " << diff << " > bound "
         << tol.element_rel * std::fabs(static_cast<double>(ref[i])) + floor << ")";
  }
  out.worst = text.str();
  return out;
}

}  // namespace ptrain::test
