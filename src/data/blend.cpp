#include "data/blend.h"

#include <cmath>

#include "core/error.h"

namespace ptrain {

namespace {

// How many of the first n samples a split of share q takes.
int64_t taken(double q, int64_t n) { return static_cast<int64_t>(std::floor(q * static_cast<double>(n))); }

}  // namespace

SourceBlend::SourceBlend(const std::vector<double>& weights) {
  PTRAIN_CHECK(!weights.empty(), "a blend needs a source");
  // What sources k.. weigh together, summed from the end: the last source of any weight then
  // has a share of exactly 1 of what reaches it, so none after it (of weight 0) is ever drawn.
  std::vector<double> rest(weights.size() + 1, 0.0);
  for (size_t k = weights.size(); k-- > 0;) {
    PTRAIN_CHECK(std::isfinite(weights[k]) && weights[k] >= 0, "source weights must be finite and >= 0");
    rest[k] = weights[k] + rest[k + 1];
  }
  PTRAIN_CHECK(rest[0] > 0 && std::isfinite(rest[0]), "source weights must not all be 0, nor sum past a double");
  for (size_t k = 0; k < weights.size(); ++k) split_.push_back(rest[k] > 0 ? weights[k] / rest[k] : 0.0);
}

int SourceBlend::source_of(int64_t index) const {
  PTRAIN_CHECK(index >= 0, "sample indices are >= 0");
  int64_t r = index;
  for (int k = 0; k + 1 < sources(); ++k) {
    const int64_t before = taken(split_[k], r), through = taken(split_[k], r + 1);
    if (through > before) return k;
    r -= before;  // its number among the samples source k leaves
  }
  return sources() - 1;
}

std::vector<int64_t> SourceBlend::counts(int64_t n) const {
  std::vector<int64_t> out;
  for (int k = 0; k < sources(); ++k) {
    out.push_back(taken(split_[k], n));
    n -= out.back();
  }
  return out;
}

}  // namespace ptrain
