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
//     mode (per non-reference mode in loss_diff); a non-finite loss lifts the pen (a new "M"),
//     an isolated point is drawn as a zero-length segment. Validation loss: one
//     `<path class="val-curve" data-mode="MODE">` (dashed) plus `<circle class="val-point"
//     data-mode="MODE">` per finite point, only for runs with evaluations.
//   - Bars: one `<rect class="bar" data-mode="MODE" data-value="V">` per mode, in report order,
//     V with one decimal (tokens/s, MiB).
//   - Coordinates have two decimals; text and attribute values are XML-escaped.
//   - Colours come from a fixed palette by the run's index in report order (same in every chart).
#pragma once

#include <string>
#include <vector>

#include "metrics/compare.h"

namespace ptrain {

// Writes into out_dir (created if missing): report.md, report.html, loss.svg, loss_diff.svg,
// throughput.svg and memory.svg. Returns the paths written, in that order. Throws UserError
// naming the file (or directory) it cannot write.
std::vector<std::string> write_report(const Comparison& c, const std::string& out_dir);

// The charts as standalone SVG documents.
std::string loss_chart_svg(const Comparison& c);        // training loss (and val loss) by step
std::string loss_diff_chart_svg(const Comparison& c);   // training loss minus the reference's
std::string throughput_chart_svg(const Comparison& c);  // median tokens/s, speedup labels
std::string memory_chart_svg(const Comparison& c);      // peak memory, MiB

// The Markdown table alone (a header and one row per mode, e.g. for the console), and the whole
// Markdown report, which embeds the charts by relative path (write_report puts them beside it).
std::string report_markdown_table(const Comparison& c);
std::string report_markdown(const Comparison& c);
// The whole report as one self-contained HTML page, the charts inlined.
std::string report_html(const Comparison& c);

}  // namespace ptrain
