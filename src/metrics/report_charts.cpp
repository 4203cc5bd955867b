// The compare report's charts, drawn from a Comparison with metrics/svg_chart.h.
#include <algorithm>
#include <cmath>
#include <map>

#include "metrics/report.h"
#include "metrics/svg_chart.h"

namespace ptrain {

using namespace svg;

std::vector<double> ema_smoothed(const std::vector<double>& values, double beta) {
  std::vector<double> out;
  out.reserve(values.size());
  double average = 0, weight = 0;  // weight: 1 - beta^t, TensorBoard's debiasing
  for (const double v : values) {
    if (!std::isfinite(v)) {  // a gap in the curve; the average starts again after it
      out.push_back(v);
      average = weight = 0;
      continue;
    }
    average = beta * average + (1 - beta) * v;
    weight = beta * weight + (1 - beta);
    out.push_back(average / weight);
  }
  return out;
}

namespace {

std::vector<double> as_doubles(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// The training time at the end of each step: the step times summed (evaluations left out).
std::vector<double> elapsed_seconds(const RunRecord& r) {
  std::vector<double> out;
  double total = 0;
  for (const double s : r.step_seconds) out.push_back(total += s);
  return out;
}

// A run's training loss as the charts draw it: faint and raw, the smoothed curve over it.
void draw_smoothed(std::string& s, const Frame& f, const std::vector<double>& xs, const std::vector<double>& ys,
                   const std::string& mode, const std::string& stroke) {
  s += curve_path("raw-curve", mode, stroke, path_data(f, xs, ys), " stroke-opacity=\"0.22\" stroke-width=\"1\"");
  s += curve_path("curve", mode, stroke, path_data(f, xs, ema_smoothed(ys, kLossEmaBeta)));
}

// Validation loss: a dashed line through the evaluations and a dot on each.
void draw_validation(std::string& s, const Frame& f, const std::vector<double>& xs, const std::vector<double>& ys,
                     const std::string& mode, const std::string& stroke) {
  s += curve_path("val-curve", mode, stroke, path_data(f, xs, ys), " stroke-dasharray=\"6 4\"");
  for (size_t j = 0; j < xs.size(); ++j) {
    if (!std::isfinite(ys[j])) continue;
    s += "<circle class=\"val-point\" data-mode=\"" + xml_escape(mode) + "\" cx=\"" + coord(f.px(xs[j])) + "\" cy=\"" +
         coord(f.py(ys[j])) + "\" r=\"3\" fill=\"" + stroke + "\"/>\n";
  }
}

bool any_evaluation(const Comparison& c) {
  return std::any_of(c.runs.begin(), c.runs.end(), [](const RunRecord& r) { return !r.val_steps.empty(); });
}

std::string ema_note() { return "EMA " + num("%g", kLossEmaBeta) + ", raw faint"; }

}  // namespace

std::string loss_chart_svg(const Comparison& c) {
  Extent steps, losses;
  for (const RunRecord& r : c.runs) {
    for (const int64_t step : r.steps) steps.add(static_cast<double>(step));
    for (const int64_t step : r.val_steps) steps.add(static_cast<double>(step));
    for (const double v : r.loss) losses.add(v);
    for (const double v : r.val_loss) losses.add(v);
  }
  const Frame f{nice_axis(steps, true), nice_axis(losses, false)};
  const bool any_val = any_evaluation(c);
  std::string s = svg_open(std::string(any_val ? "Training and validation loss by step" : "Training loss by step") +
                           " (" + ema_note() + ")");
  draw_axes(s, f, "step", "loss", true);
  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRecord& r = c.runs[i];
    draw_smoothed(s, f, as_doubles(r.steps), r.loss, r.mode, color(i));
    if (!r.val_steps.empty()) draw_validation(s, f, as_doubles(r.val_steps), r.val_loss, r.mode, color(i));
    legend.push_back({r.mode, color(i), false});
  }
  if (any_val) legend.push_back({"val loss", "#555555", true});
  draw_legend(s, legend);
  return s + "</svg>\n";
}

std::string loss_time_chart_svg(const Comparison& c) {
  // Each run's step ends and evaluations placed at the training time they happened.
  std::vector<std::vector<double>> step_times, val_times;
  Extent times, losses;
  for (const RunRecord& r : c.runs) {
    step_times.push_back(elapsed_seconds(r));
    val_times.emplace_back();
    for (const int64_t step : r.val_steps)
      val_times.back().push_back(training_seconds_at(r.steps, r.step_seconds, static_cast<double>(step)));
    for (const double t : step_times.back()) times.add(t);
    for (const double v : r.loss) losses.add(v);
    for (const double v : r.val_loss) losses.add(v);
  }
  times.add(0);
  if (c.target_loss) losses.add(*c.target_loss);
  // Minutes once the runs are long enough that seconds make unwieldy ticks.
  const double unit = times.hi > 600 ? 60 : 1;
  const Frame f{nice_axis(Extent{times.lo / unit, times.hi / unit}, false), nice_axis(losses, false)};
  const auto scaled = [&](std::vector<double> v) {
    for (double& x : v) x /= unit;
    return v;
  };
  std::string s = svg_open("Loss by training time (" + ema_note() + ")");
  draw_axes(s, f, std::string("training time, evaluations and saves left out (") + (unit > 1 ? "min" : "s") + ")",
            "loss", true);
  std::vector<LegendEntry> legend;
  if (c.target_loss) {
    const double y = f.py(*c.target_loss);
    s += line(kPlotLeft, y, kPlotRight, y, "target", "#333333", " stroke-dasharray=\"2 3\"");
    s += text(kPlotRight - 4, y - 5, "target " + num("%.4f", *c.target_loss), "value-note", "end");
  }
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRecord& r = c.runs[i];
    draw_smoothed(s, f, scaled(step_times[i]), r.loss, r.mode, color(i));
    if (!r.val_steps.empty()) draw_validation(s, f, scaled(val_times[i]), r.val_loss, r.mode, color(i));
    if (c.target_loss && c.results[i].time_to_target_s)
      s += "<circle class=\"target-point\" data-mode=\"" + xml_escape(r.mode) + "\" cx=\"" +
           coord(f.px(*c.results[i].time_to_target_s / unit)) + "\" cy=\"" + coord(f.py(*c.target_loss)) +
           "\" r=\"5\" fill=\"none\" stroke-width=\"2\" stroke=\"" + color(i) + "\"/>\n";
    legend.push_back({r.mode, color(i), false});
  }
  if (any_evaluation(c)) legend.push_back({"val loss", "#555555", true});
  draw_legend(s, legend);
  return s + "</svg>\n";
}

std::string loss_diff_chart_svg(const Comparison& c) {
  // compare_runs puts the reference first.
  std::map<int64_t, double> reference;
  const RunRecord* ref = &c.runs.front();
  for (size_t j = 0; j < ref->steps.size(); ++j) reference[ref->steps[j]] = ref->loss[j];

  struct Curve {
    size_t run;
    std::vector<double> steps;
    std::vector<double> diff;  // not finite where either loss is not
  };
  std::vector<Curve> curves;
  Extent steps;
  for (const int64_t step : ref->steps) steps.add(static_cast<double>(step));
  Extent diffs;
  diffs.add(0);  // the zero line is always in view
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRecord& r = c.runs[i];
    if (&r == ref) continue;
    Curve curve{i, {}, {}};
    for (size_t j = 0; j < r.steps.size(); ++j) {
      const auto it = reference.find(r.steps[j]);
      if (it == reference.end()) continue;
      curve.steps.push_back(static_cast<double>(r.steps[j]));
      curve.diff.push_back(r.loss[j] - it->second);
      steps.add(curve.steps.back());
      diffs.add(curve.diff.back());
    }
    curves.push_back(std::move(curve));
  }
  const Frame f{nice_axis(steps, true), nice_axis(diffs, false)};
  std::string s = svg_open("Training loss minus " + c.reference + "'s (" + ema_note() + ")");
  draw_axes(s, f, "step", "loss − " + c.reference + " loss", true);
  s += line(kPlotLeft, f.py(0), kPlotRight, f.py(0), "zero", "#333333", " stroke-dasharray=\"4 3\"");
  std::vector<LegendEntry> legend;
  for (const Curve& curve : curves) {
    const std::string& mode = c.runs[curve.run].mode;
    draw_smoothed(s, f, curve.steps, curve.diff, mode, color(curve.run));
    legend.push_back({mode, color(curve.run), false});
  }
  draw_legend(s, legend);
  return s + "</svg>\n";
}

std::string throughput_chart_svg(const Comparison& c) {
  std::vector<Bar> bars;
  for (const ModeResult& r : c.results)
    bars.push_back({r.mode, r.tokens_per_s, thousands(r.tokens_per_s), num("%.2fx", r.speedup)});
  return bar_chart("Throughput: median tokens/s (speedup vs " + c.reference + ")", "tokens/s", bars);
}

std::string memory_chart_svg(const Comparison& c) {
  std::vector<Bar> bars;
  for (const ModeResult& r : c.results) bars.push_back({r.mode, r.peak_memory_mib, num("%.1f", r.peak_memory_mib), ""});
  return bar_chart("Peak memory (" + memory_kind(c) + ")", "peak memory (MiB)", bars);
}

std::string memory_kind(const Comparison& c) {
  size_t on_device = 0;
  for (const ModeResult& r : c.results) on_device += r.device_memory ? 1 : 0;
  if (on_device == 0) return "host resident memory";
  return on_device == c.results.size() ? "device memory" : "device memory on GPUs, else host";
}

}  // namespace ptrain
