#include "metrics/svg_chart.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iterator>
#include <utility>

#include "core/format.h"
#include "metrics/run_log.h"

namespace ptrain::svg {

std::string num(const char* format, double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return format_number(format, v);
}

std::string thousands(double v) { return std::isfinite(v) ? format_thousands(v) : num("%.0f", v); }

std::string xml_escape(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

namespace {
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
}  // namespace

std::string color(size_t run_index) { return kPalette[run_index % std::size(kPalette)]; }

std::string coord(double v) { return num("%.2f", v); }

std::string text(double x, double y, const std::string& content, const std::string& cls, const char* anchor,
                 const std::string& extra) {
  return "<text class=\"" + cls + "\" x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" text-anchor=\"" + anchor + "\"" +
         extra + ">" + xml_escape(content) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& cls, const std::string& stroke,
                 const std::string& extra) {
  return "<line class=\"" + cls + "\" x1=\"" + coord(x1) + "\" y1=\"" + coord(y1) + "\" x2=\"" + coord(x2) +
         "\" y2=\"" + coord(y2) + "\" stroke=\"" + stroke + "\"" + extra + "/>\n";
}

std::string svg_open(const std::string& title) {
  return "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
         "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"400\" viewBox=\"0 0 720 400\" "
         "font-family=\"sans-serif\" font-size=\"12\">\n<title>" +
         xml_escape(title) + "</title>\n<rect class=\"background\" x=\"0\" y=\"0\" width=\"" + coord(kWidth) +
         "\" height=\"" + coord(kHeight) + "\" fill=\"white\"/>\n" +
         text(kWidth / 2, 26, title, "title", "middle", " font-size=\"15\" font-weight=\"bold\"");
}

void Extent::add(double v) {
  if (!std::isfinite(v)) return;
  lo = std::min(lo, v);
  hi = std::max(hi, v);
}

Axis nice_axis(Extent e, bool integer_ticks) {
  if (e.lo > e.hi) e = {0, 1};  // no finite data
  if (e.hi - e.lo <= 1e-12 * std::max(1.0, std::fabs(e.hi))) {  // one value: give the range a span
    const double pad = e.lo != 0 ? std::fabs(e.lo) * 0.1 : 1.0;
    e = {e.lo - pad, e.hi + pad};
  }
  const double raw = (e.hi - e.lo) / 5;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / magnitude;
  double step = (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * magnitude;
  if (integer_ticks) step = std::max(step, 1.0);
  const double slack = 1e-9;  // 0.7 / 0.1 is 6.999..., not a reason for an extra tick
  return {std::floor(e.lo / step + slack) * step, std::ceil(e.hi / step - slack) * step, step};
}

namespace {

std::vector<double> ticks(const Axis& a) {
  std::vector<double> out;
  for (long long k = std::llround(a.lo / a.step); k * a.step <= a.hi + a.step * 1e-6; ++k) out.push_back(k * a.step);
  return out;
}

std::string tick_label(double v, double step) {
  if (step >= 1) return format_thousands(v);
  const int decimals = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

void draw_axes(std::string& s, const Frame& f, const std::string& x_title, const std::string& y_title,
               bool x_ticks) {
  for (const double v : ticks(f.y)) {
    const double y = f.py(v);
    s += line(kPlotLeft, y, kPlotRight, y, "grid", "#e6e6e6");
    s += line(kPlotLeft - 5, y, kPlotLeft, y, "tick", "#333333");
    s += text(kPlotLeft - 8, y + 4, tick_label(v, f.y.step), "tick-label", "end");
  }
  if (x_ticks) {
    for (const double v : ticks(f.x)) {
      const double x = f.px(v);
      s += line(x, kPlotBottom, x, kPlotBottom + 5, "tick", "#333333");
      s += text(x, kPlotBottom + 18, tick_label(v, f.x.step), "tick-label", "middle");
    }
  }
  s += line(kPlotLeft, kPlotTop, kPlotLeft, kPlotBottom, "axis", "#333333");
  s += line(kPlotLeft, kPlotBottom, kPlotRight, kPlotBottom, "axis", "#333333");
  s += text((kPlotLeft + kPlotRight) / 2, kPlotBottom + 40, x_title, "axis-title", "middle");
  const double mid = (kPlotTop + kPlotBottom) / 2;
  s += text(20, mid, y_title, "axis-title", "middle", " transform=\"rotate(-90 20 " + coord(mid) + ")\"");
}

namespace {
// The legend column holds about 14 characters at the chart's 12 px font; a longer label (a
// precision schedule such as "fp8:current>bf16@450", a mode with FP8 settings such as
// "fp8:current+primary+codes") goes on one line per phase and setting, broken after each '>'
// and before each '+'.
std::vector<std::string> legend_lines(const std::string& label) {
  constexpr size_t kLegendChars = 14;
  if (label.size() <= kLegendChars) return {label};
  std::vector<std::string> lines(1);
  for (const char ch : label) {
    if (ch == '+' && !lines.back().empty()) lines.emplace_back();
    lines.back() += ch;
    if (ch == '>') lines.emplace_back();
  }
  if (lines.back().empty()) lines.pop_back();
  return lines;
}
}  // namespace

void draw_legend(std::string& s, const std::vector<LegendEntry>& entries) {
  s += "<g class=\"legend\">\n";
  double y = kPlotTop + 8;
  for (const LegendEntry& e : entries) {
    s += line(kLegendX, y, kLegendX + 22, y, "legend-swatch", e.color,
              std::string(" stroke-width=\"3\"") + (e.dashed ? " stroke-dasharray=\"6 4\"" : ""));
    const std::vector<std::string> lines = legend_lines(e.label);
    for (size_t i = 0; i < lines.size(); ++i) s += text(kLegendX + 28, y + 4 + 14 * i, lines[i], "legend-label", "start");
    y += 20 + 14 * (lines.size() - 1);
  }
  s += "</g>\n";
}

std::string path_data(const Frame& f, const std::vector<double>& xs, const std::vector<double>& ys) {
  std::vector<std::vector<std::pair<double, double>>> pieces(1);
  for (size_t i = 0; i < xs.size(); ++i) {
    if (std::isfinite(ys[i]) && std::isfinite(xs[i]))
      pieces.back().emplace_back(f.px(xs[i]), f.py(ys[i]));
    else if (!pieces.back().empty())
      pieces.emplace_back();
  }
  std::string d;
  for (auto& piece : pieces) {
    if (piece.size() == 1) piece.push_back(piece[0]);
    for (size_t i = 0; i < piece.size(); ++i) {
      if (!d.empty()) d += ' ';
      d += (i == 0 ? "M " : "L ") + coord(piece[i].first) + " " + coord(piece[i].second);
    }
  }
  return d;
}

std::string curve_path(const std::string& cls, const std::string& mode, const std::string& stroke,
                       const std::string& d, const std::string& extra) {
  return "<path class=\"" + cls + "\" data-mode=\"" + xml_escape(mode) + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" +
         stroke + "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" stroke-linecap=\"round\"" + extra + "/>\n";
}

std::string bar_chart(const std::string& title, const std::string& y_title, const std::vector<Bar>& bars) {
  Extent values;
  for (const Bar& b : bars) values.add(b.value);
  // From zero, with headroom for the labels above the tallest bar.
  const Frame f{Axis{}, nice_axis(Extent{0, values.hi > 0 ? values.hi * 1.15 : 1.0}, false)};
  std::string s = svg_open(title);
  draw_axes(s, f, "mode", y_title, false);
  const double slot = (kPlotRight - kPlotLeft) / static_cast<double>(std::max<size_t>(1, bars.size()));
  const double width = std::min(slot * 0.6, 72.0);
  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double x = kPlotLeft + slot * (static_cast<double>(i) + 0.5);
    const double top = f.py(std::isfinite(b.value) ? std::max(b.value, 0.0) : 0.0);
    s += "<rect class=\"bar\" data-mode=\"" + xml_escape(b.mode) + "\" data-value=\"" + num("%.1f", b.value) +
         "\" x=\"" + coord(x - width / 2) + "\" y=\"" + coord(top) + "\" width=\"" + coord(width) + "\" height=\"" +
         coord(kPlotBottom - top) + "\" fill=\"" + color(i) + "\"/>\n";
    s += text(x, top - 6, b.label, "value-label", "middle");
    if (!b.note.empty()) s += text(x, top - 21, b.note, "value-note", "middle", " font-weight=\"bold\"");
    s += text(x, kPlotBottom + 16, b.mode, "category-label", "middle");
    legend.push_back({b.mode, color(i), false});
  }
  draw_legend(s, legend);
  return s + "</svg>\n";
}

}  // namespace ptrain::svg
