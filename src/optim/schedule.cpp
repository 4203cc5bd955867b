#include "optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace ptrain {

double LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  const double min_lr = lr * min_lr_ratio;
  const int64_t decay_steps = std::max<int64_t>(1, total_steps - warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps));
  switch (decay) {
    case Decay::constant: return lr;
    case Decay::linear: return lr - (lr - min_lr) * progress;
    case Decay::cosine: return min_lr + 0.5 * (lr - min_lr) * (1.0 + std::cos(M_PI * progress));
    case Decay::wsd: {
      // Warmup-stable-decay: hold lr, then decay linearly over the last fraction of the steps.
      const double stable = 1.0 - wsd_decay_fraction;
      if (progress <= stable) return lr;
      return lr - (lr - min_lr) * (progress - stable) / wsd_decay_fraction;
    }
  }
  PTRAIN_CHECK(false, "unknown schedule.decay");
  return lr;
}

}  // namespace ptrain
