#include "precision/loss_scaler.h"

#include <algorithm>

#include "core/error.h"

namespace ptrain {

LossScaler::LossScaler(const LossScalingConfig& config)
    : config_(config),
      scale_(config.mode == LossScalingMode::off ? 1.0 : config.init),
      hysteresis_left_(config.hysteresis) {
  PTRAIN_CHECK(config.mode != LossScalingMode::auto_, "the loss scaler's mode was not resolved from auto");
}

bool LossScaler::update(bool found_nonfinite) {
  if (found_nonfinite) ++skipped_;  // counted in every mode: the optimizer step is skipped
  if (config_.mode != LossScalingMode::dynamic) return found_nonfinite;

  if (found_nonfinite) {
    growth_tracker_ = 0;
    // As Megatron: once the counter is spent, every further non-finite step backs off until a
    // growth refills it. Megatron lets it fall below 0; it stops at 0 here, which decides the
    // same, and keeps it inside what a checkpoint's state.json may hold (a checkpoint saved
    // after a run of overflows was refused as unusable when it held -1).
    hysteresis_left_ = std::max(hysteresis_left_ - 1, 0);
    if (hysteresis_left_ <= 0) scale_ = std::max(scale_ * config_.backoff_factor, config_.min_scale);
  } else if (++growth_tracker_ >= config_.growth_interval) {
    growth_tracker_ = 0;
    hysteresis_left_ = config_.hysteresis;
    scale_ *= config_.growth_factor;
  }
  return found_nonfinite;
}

void LossScaler::restore(const State& s) {
  scale_ = s.scale;
  growth_tracker_ = s.growth_tracker;
  hysteresis_left_ = std::max(s.hysteresis_left, 0);  // earlier versions saved it below 0
  skipped_ = s.skipped;
}

}  // namespace ptrain
