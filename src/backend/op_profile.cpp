#include "backend/op_profile.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace ptrain {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

const char* op_family_name(OpFamily f) {
  switch (f) {
    case OpFamily::gemm: return "GEMMs (linear layers, LM head)";
    case OpFamily::attention: return "attention";
    case OpFamily::classifier: return "classifier (softmax, loss)";
    case OpFamily::norms: return "norms (layernorm, RMSNorm)";
    case OpFamily::activations: return "activations (GELU, SwiGLU)";
    case OpFamily::bias: return "bias";
    case OpFamily::residual: return "residual adds";
    case OpFamily::embedding: return "embedding";
    case OpFamily::adamw: return "AdamW";
    case OpFamily::rounding: return "rounding to format";
    case OpFamily::fp8_casts: return "FP8 casts, amax";
    case OpFamily::reductions: return "reductions (grad norm)";
    case OpFamily::memory: return "zeroing, copies";
    case OpFamily::count: break;
  }
  return "?";
}

void OpProfile::charge(Clock::time_point now) {
  if (in_step_ && !stack_.empty())
    current_[static_cast<size_t>(stack_.back())] += std::chrono::duration<double>(now - last_).count();
  last_ = now;
}

void OpProfile::begin(OpFamily f) {
  charge(now_());
  stack_.push_back(f);
}

void OpProfile::end() {
  PTRAIN_CHECK(!stack_.empty(), "OpProfile::end without begin");
  charge(now_());
  stack_.pop_back();
}

void OpProfile::add_gemm(const std::string& shape, double flops, double seconds) {
  if (!in_step_) return;
  current_gemm_flops_ += flops;
  if (steps_.empty()) return;  // the shapes' rates leave out the warm-up step too
  auto& [s, f] = shapes_[shape];
  s += seconds;
  f += flops;
}

void OpProfile::begin_step() {
  PTRAIN_CHECK(stack_.empty(), "OpProfile::begin_step inside an op");
  in_step_ = true;
}

void OpProfile::end_step(double step_s) {
  PTRAIN_CHECK(in_step_ && stack_.empty(), "OpProfile::end_step outside a step or inside an op");
  in_step_ = false;
  steps_.push_back(current_);
  step_seconds_.push_back(step_s);
  gemm_flops_.push_back(current_gemm_flops_);
  current_ = {};
  current_gemm_flops_ = 0;
}

OpProfile::Summary OpProfile::summary() const {
  Summary s;
  const size_t first = steps_.size() > 1 ? 1 : 0;  // step 1 warms caches and thread pools
  s.steps = steps_.size() - first;
  if (s.steps == 0) return s;
  s.step_ms = 1e3 * median(std::vector<double>(step_seconds_.begin() + first, step_seconds_.end()));
  std::vector<double> outside;
  double gemm_s = 0, gemm_flops = 0;
  for (size_t i = first; i < steps_.size(); ++i) {
    double ops = 0;
    for (double t : steps_[i]) ops += t;
    outside.push_back(step_seconds_[i] - ops);
    gemm_s += steps_[i][static_cast<size_t>(OpFamily::gemm)];
    gemm_flops += gemm_flops_[i];
  }
  s.outside_ms = 1e3 * median(outside);
  s.gemm_flops_per_s = gemm_s > 0 ? gemm_flops / gemm_s : 0;
  for (size_t f = 0; f < static_cast<size_t>(OpFamily::count); ++f) {
    std::vector<double> times;
    for (size_t i = first; i < steps_.size(); ++i) times.push_back(steps_[i][f]);
    const double ms = 1e3 * median(times);
    if (ms > 0) s.rows.push_back({static_cast<OpFamily>(f), ms, ms / s.step_ms});
  }
  std::sort(s.rows.begin(), s.rows.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  for (const auto& [shape, totals] : shapes_)
    s.gemm_shapes.push_back({shape, 1e3 * totals.first / static_cast<double>(s.steps),
                             totals.first > 0 ? totals.second / totals.first : 0});
  std::sort(s.gemm_shapes.begin(), s.gemm_shapes.end(),
            [](const GemmShape& a, const GemmShape& b) { return a.ms > b.ms; });
  return s;
}

std::string format_profile(const OpProfile::Summary& s, double ceiling_flops) {
  // Above the ceiling, a rate says the ceiling was measured too low, not that a GEMM beat it.
  const auto stale = [&](double flops) { return flops > ceiling_flops ? " (above 100%: the ceiling is stale)" : ""; };
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "profile: median ms per step over %zu steps, exclusive time per op family\n",
                s.steps);
  out += line;
  for (const OpProfile::Row& r : s.rows) {
    std::snprintf(line, sizeof line, "  %-32s %9.1f ms %6.1f %%", op_family_name(r.family), r.ms, 100 * r.share);
    out += line;
    if (r.family == OpFamily::gemm && s.gemm_flops_per_s > 0) {
      std::snprintf(line, sizeof line, "   %.1f GFLOP/s, %.0f %% of the sgemm ceiling%s", s.gemm_flops_per_s / 1e9,
                    100 * s.gemm_flops_per_s / ceiling_flops, stale(s.gemm_flops_per_s));
      out += line;
    }
    out += "\n";
    if (r.family != OpFamily::gemm) continue;
    for (const OpProfile::GemmShape& g : s.gemm_shapes) {
      std::snprintf(line, sizeof line, "    %-30s %9.1f ms            %.1f GFLOP/s, %.0f %%%s\n", g.shape.c_str(), g.ms,
                    g.flops_per_s / 1e9, 100 * g.flops_per_s / ceiling_flops, stale(g.flops_per_s));
      out += line;
    }
  }
  std::snprintf(line, sizeof line, "  %-32s %9.1f ms %6.1f %%\n", "outside ops (trainer, data)", s.outside_ms,
                100 * s.outside_ms / s.step_ms);
  out += line;
  std::snprintf(line, sizeof line, "  %-32s %9.1f ms (medians need not add up to it)\n", "step", s.step_ms);
  out += line;
  return out;
}

}  // namespace ptrain
