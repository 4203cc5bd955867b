#include "optim/divergence_guard.h"

#include <cmath>

#include "core/format.h"

namespace ptrain {

DivergenceGuard::Finding DivergenceGuard::observe(double loss) {
  const Verdict act = config_.action == GuardAction::skip       ? Verdict::skip
                      : config_.action == GuardAction::rollback ? Verdict::rollback
                                                                : Verdict::stop;
  if (!std::isfinite(loss)) {
    // A non-finite loss after spiking steps belongs to the same divergence.
    const int bad = spike_run_ + 1;
    spike_run_ = 0;
    return {act, "the loss is " + format_number("%g", loss), bad};
  }
  if (config_.spike_zscore > 0 && static_cast<int>(window_.size()) == config_.window) {
    double mean = 0, var = 0;
    for (const double v : window_) mean += v;
    mean /= static_cast<double>(window_.size());
    for (const double v : window_) var += (v - mean) * (v - mean);
    const double sd = std::sqrt(var / static_cast<double>(window_.size()));
    const double z = sd > 0 ? (loss - mean) / sd : (loss > mean ? INFINITY : 0.0);
    if (z > config_.spike_zscore) {
      if (++spike_run_ >= config_.spike_steps)
        return {act, "loss " + format_number("%.6g", loss) + " is " + format_number("%.3g", z) +
                         " standard deviations above the mean of the last " + std::to_string(config_.window) +
                         " steps (" + format_number("%.6g", mean) + "), for " + std::to_string(spike_run_) +
                         (spike_run_ == 1 ? " step" : " steps in a row") + " (training.guard.spike_zscore " + format_number("%g", config_.spike_zscore) + ")",
                spike_run_};
      return {};
    }
  }
  spike_run_ = 0;
  consecutive_skips_ = 0;
  window_.push_back(loss);
  if (static_cast<int>(window_.size()) > config_.window) window_.pop_front();
  return {};
}

void DivergenceGuard::restore(const State& s) {
  window_.assign(s.window.begin(), s.window.end());
  while (static_cast<int>(window_.size()) > config_.window) window_.pop_front();
  spike_run_ = s.spike_run;
  skipped_ = s.skipped;
  consecutive_skips_ = s.consecutive_skips;
  rollback_ = s.rollback;
}

}  // namespace ptrain
