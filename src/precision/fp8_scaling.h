// FP8 scaling factors. A tensor x is cast as q = fp8(x * scale); the GEMM multiplies by
// 1/scale (scale_inv) to dequantise. Recipes (TransformerEngine semantics):
//  - delayed: per tensor, from a history of amax values of earlier steps;
//  - current: per tensor, from the amax of the tensor being cast;
//  - block:   per 1x128 tile or 128x128 block, from that block's amax.
#pragma once

#include <cstdint>
#include <vector>

#include "config/choices.h"

namespace ptrain {

// scale = fp8_max / amax / 2^margin for a finite amax > 0; otherwise `previous`. A scale that
// would be infinite (tiny amax) becomes FLT_MAX.
float scale_from_amax(float amax, float fp8_max, int margin, float previous);

// current and block recipes: scale = fp8_max / amax, and 1 when amax is 0 or not finite.
float current_scale(float amax, float fp8_max);

// The delayed-scaling state of one FP8 tensor. Slot 0 of the history collects the current
// step's amax (max over the step's casts, e.g. over micro-batches); end_step() computes the
// next scale from the history (max over all slots, or slot 0 for most_recent), then rolls the
// history by one and zeroes slot 0. So the scale used in step t depends on steps < t only.
class DelayedScaling {
 public:
  DelayedScaling(int history_len, AmaxAlgo algo, float fp8_max, int margin);

  float scale() const { return scale_; }            // 1 until the first end_step()
  void record(float amax);                          // slot 0 = max(slot 0, amax); NaN/inf recorded as-is
  void end_step();
  // Forgets the current step's amax (slot 0 back to 0): a step abandoned before its update.
  void discard_current() { history_[0] = 0.0f; }
  const std::vector<float>& history() const { return history_; }  // [0] = current step
  void restore(const std::vector<float>& history, float scale);

 private:
  std::vector<float> history_;
  AmaxAlgo algo_;
  float fp8_max_;
  int margin_;
  float scale_ = 1.0f;
};

}  // namespace ptrain
