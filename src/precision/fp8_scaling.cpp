#include "precision/fp8_scaling.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace ptrain {

float scale_from_amax(float amax, float fp8_max, int margin, float previous) {
  // 0 (tensor never seen / all zeros), NaN and inf carry no usable range: keep the old scale.
  if (!(std::isfinite(amax) && amax > 0.0f)) return previous;
  const float scale = std::ldexp(fp8_max / amax, -margin);
  return std::isinf(scale) ? FLT_MAX : scale;
}

float current_scale(float amax, float fp8_max) {
  if (!(std::isfinite(amax) && amax > 0.0f)) return 1.0f;
  const float scale = fp8_max / amax;
  return std::isinf(scale) ? FLT_MAX : scale;  // as TransformerEngine: never an infinite scale
}

DelayedScaling::DelayedScaling(int history_len, AmaxAlgo algo, float fp8_max, int margin)
    : algo_(algo), fp8_max_(fp8_max), margin_(margin) {
  PTRAIN_CHECK(history_len >= 1, "amax history length must be at least 1");
  history_.assign(static_cast<size_t>(history_len), 0.0f);
}

// NaN is sticky (std::max would drop it depending on argument order): a step that saw a NaN
// amax keeps NaN in its slot, so the scale computed from a window holding it stays unchanged.
static float nan_max(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
  return std::max(a, b);
}

void DelayedScaling::record(float amax) { history_[0] = nan_max(history_[0], amax); }

void DelayedScaling::end_step() {
  float amax = history_[0];
  if (algo_ == AmaxAlgo::max)
    for (float a : history_) amax = nan_max(amax, a);
  scale_ = scale_from_amax(amax, fp8_max_, margin_, scale_);
  // torch.roll(history, -1): slot i+1 moves to i, slot 0 (this step) to the last slot.
  std::rotate(history_.begin(), history_.begin() + 1, history_.end());
  history_[0] = 0.0f;
}

void DelayedScaling::restore(const std::vector<float>& history, float scale) {
  PTRAIN_CHECK(history.size() == history_.size(), "restored amax history has the wrong length");
  history_ = history;
  scale_ = scale;
}

}  // namespace ptrain
