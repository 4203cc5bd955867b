// Loss scaling for reduced-precision gradients, as PyTorch's GradScaler and Megatron's
// DynamicGradScaler do it: the loss is multiplied by `scale` before backward so small gradients
// stay representable; gradients are divided by it before the optimizer. A step whose gradients
// hold any inf/NaN is skipped and counted, whatever the mode.
#pragma once

#include <cstdint>

#include "config/config.h"

namespace ptrain {

class LossScaler {
 public:
  // config.mode must be resolved to off, static or dynamic (PrecisionPolicy resolves "auto").
  explicit LossScaler(const LossScalingConfig& config);

  // The factor the loss is multiplied by this step (1 when mode is off).
  double scale() const { return scale_; }

  // Called once per optimizer step, after backward, with whether any gradient was inf or NaN.
  // Returns true when the optimizer step must be skipped (exactly when found_nonfinite).
  //  - off, static: the scale never changes.
  //  - dynamic (Megatron semantics): on a non-finite step the growth counter resets and the
  //    hysteresis counter drops by one; when it reaches 0 or below, scale = max(scale *
  //    backoff_factor, min_scale). After growth_interval consecutive finite steps, scale *=
  //    growth_factor, the growth counter resets and the hysteresis counter refills.
  bool update(bool found_nonfinite);

  int64_t skipped_steps() const { return skipped_; }

  // Everything needed to resume exactly.
  struct State {
    double scale;
    int64_t growth_tracker;
    int hysteresis_left;
    int64_t skipped;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_left_, skipped_}; }
  void restore(const State& s);

 private:
  LossScalingConfig config_;
  double scale_;
  int64_t growth_tracker_ = 0;
  int hysteresis_left_;
  int64_t skipped_ = 0;
};

}  // namespace ptrain
