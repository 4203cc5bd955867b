// Which training source each sample comes from when data.sources blends several, as a pure
// function of the sample index, so a run's data position stays one counter: a resume and any
// rank count draw the same samples from the same sources.
//
// Sources are split off one at a time. Source 0 takes sample r exactly when floor(q0 (r + 1))
// passes floor(q0 r), with q0 its share of the weight (in double precision, the same on every
// CPU): among the first n samples it takes floor(q0 n), spread evenly. The samples it leaves
// are numbered afresh and source 1 takes its share q1 = w1 / (w1 + w2 + ...) of those in the
// same way, and so on. With K sources each one's count over the first n samples stays within
// K - 1 samples of its weight's share (one, for two sources), from the first step on
// (Megatron-LM's blended dataset interleaves sources as evenly, by a running error it keeps in
// a table).
#pragma once

#include <cstdint>
#include <vector>

namespace ptrain {

class SourceBlend {
 public:
  // Weights >= 0, not all 0 (the config checks both).
  explicit SourceBlend(const std::vector<double>& weights);
  int sources() const { return static_cast<int>(split_.size()); }
  // The source sample `index` (>= 0) comes from.
  int source_of(int64_t index) const;
  // How many of samples [0, n) each source gives.
  std::vector<int64_t> counts(int64_t n) const;

 private:
  std::vector<double> split_;  // source k's share of what sources 0..k-1 leave
};

}  // namespace ptrain
