// The report of `ptrain compare`: the table and charts a user reads to decide whether a
// reduced-precision mode is worth what it costs. Markdown for repositories and terminals, one
// self-contained HTML file for browsers (charts inlined, no scripts, no network), and the charts
// as standalone SVG written by hand: no image library, and the files stay small and diffable.
// Everything is a pure function of the Comparison (no timestamps): same runs, same bytes.
//
// SVG conventions (tests rely on them):
//   - `<?xml ...?>`, then `<svg xmlns="http://www.w3.org/2000/svg" width="720" height="400"
//     viewBox="0 0 720 400">`, a `<title>`, a white `<rect class="background">`.
//   - Text elements carry a class: "title", "tick-label", "axis-title", "legend-label",
//     "value-label", "value-note", "category-label"; the legend is a `<g class="legend">`.
//   - Lines: class "grid", "tick", "axis"; the zero line of loss_diff is `<line class="zero">`.
//   - Loss curves: exactly one `<path class="curve" data-mode="MODE" d="M x y L x y ...">` per
//     mode (per non-reference mode in loss_diff), the training loss smoothed by ema_smoothed
//     with kLossEmaBeta, and behind it one faint `<path class="raw-curve" data-mode="MODE">` of
//     the raw values; a non-finite loss lifts the pen (a new "M"), an isolated point is drawn as
//     a zero-length segment. Validation loss: one `<path class="val-curve" data-mode="MODE">`
//     (dashed) plus `<circle class="val-point" data-mode="MODE">` per finite point, only for
//     runs with evaluations. loss_time: the target val loss as `<line class="target">`, and a
//     `<circle class="target-point" data-mode="MODE">` where each mode first reached it.
//   - Bars: one `<rect class="bar" data-mode="MODE" data-value="V">` per mode, in report order,
//     V with one decimal (tokens/s, MiB).
//   - Coordinates have two decimals; text and attribute values are XML-escaped.
//   - Colours come from a fixed palette by the run's index in report order (same in every chart).
#pragma once

#include <string>
#include <vector>

#include "metrics/comparison.h"

namespace ptrain {

// Writes into out_dir (created if missing): report.md, report.html, loss.svg, loss_time.svg,
// loss_diff.svg, throughput.svg and memory.svg. Returns the paths written, in that order.
// Throws UserError naming the file (or directory) it cannot write.
std::vector<std::string> write_report(const Comparison& c, const std::string& out_dir);

// The charts' smoothing of training loss: an exponential moving average, debiased as
// TensorBoard does (the average over the first t values divided by 1 - beta^t), so the curve
// starts at the first value. A non-finite value passes through and restarts the average.
constexpr double kLossEmaBeta = 0.9;
std::vector<double> ema_smoothed(const std::vector<double>& values, double beta);

// The charts as standalone SVG documents.
std::string loss_chart_svg(const Comparison& c);        // training loss (and val loss) by step
std::string loss_time_chart_svg(const Comparison& c);   // the same by training time, the target marked
std::string loss_diff_chart_svg(const Comparison& c);   // training loss minus the reference's
std::string throughput_chart_svg(const Comparison& c);  // median tokens/s, speedup labels
std::string memory_chart_svg(const Comparison& c);      // peak memory, MiB
// What "peak memory" measured: a GPU's arena, the process's resident memory, or a mix.
std::string memory_kind(const Comparison& c);

// The paragraph the report leads with: per mode, how soon it reached the target against the
// reference, its final val loss, peak memory and throughput in words, then which modes are
// beyond the tolerance. Generated from the numbers alone.
std::string verdict_paragraph(const Comparison& c);

// The verdict and the two tables (quality; speed and memory), e.g. for the console, and the
// whole Markdown report, which embeds the charts by relative path (write_report puts them
// beside it).
std::string report_markdown_summary(const Comparison& c);
std::string report_markdown(const Comparison& c);
// The whole report as one self-contained HTML page, the charts inlined.
std::string report_html(const Comparison& c);

}  // namespace ptrain
