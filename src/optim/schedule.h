// Learning-rate schedules: linear warmup from lr/warmup to lr, then decay to lr * min_lr_ratio.
#pragma once

#include <cstdint>

#include "config/choices.h"

namespace ptrain {

struct LrSchedule {
  double lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  Decay decay = Decay::cosine;
  double min_lr_ratio = 0.1;
  double wsd_decay_fraction = 0.2;

  // Learning rate for 0-based optimizer step `step`.
  double at(int64_t step) const;
};

}  // namespace ptrain
