// Hand-written SVG for the compare report's charts: number formatting that reads the same on
// every platform, XML escaping, a fixed 720x400 canvas with a plot area and a legend to its right,
// axes with 1-2-5 ticks, polylines that lift the pen at non-finite values, and bar charts. The
// conventions tests rely on are listed in metrics/report.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace ptrain::svg {

// printf of one number; NaN and infinities spelled out the same way on every platform.
std::string num(const char* format, double v);
std::string thousands(double v);  // "53,780"; non-finite as num spells it
std::string xml_escape(const std::string& s);

constexpr double kWidth = 720, kHeight = 400;
// The plot area; the legend sits to its right.
constexpr double kPlotLeft = 72, kPlotRight = 556, kPlotTop = 48, kPlotBottom = 340;
constexpr double kLegendX = 574;

std::string color(size_t run_index);  // a fixed palette, by the run's index in report order
std::string coord(double v);          // two decimals

std::string text(double x, double y, const std::string& content, const std::string& cls, const char* anchor,
                 const std::string& extra = "");
std::string line(double x1, double y1, double x2, double y2, const std::string& cls, const std::string& stroke,
                 const std::string& extra = "");
// The XML declaration, the <svg> root, its <title>, the white background and the title text.
std::string svg_open(const std::string& title);

// The smallest and largest finite values seen (lo > hi while there are none).
struct Extent {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v);
};

// A range rounded out to whole ticks, the tick step being 1, 2 or 5 x 10^k.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};
Axis nice_axis(Extent e, bool integer_ticks);

// Data coordinates to SVG coordinates.
struct Frame {
  Axis x, y;
  double px(double v) const { return kPlotLeft + (v - x.lo) / (x.hi - x.lo) * (kPlotRight - kPlotLeft); }
  double py(double v) const { return kPlotBottom - (v - y.lo) / (y.hi - y.lo) * (kPlotBottom - kPlotTop); }
};

// Grid lines, both axes with ticks and labels, the axis titles. A bar chart's x axis has no
// ticks (its bars are labelled instead).
void draw_axes(std::string& s, const Frame& f, const std::string& x_title, const std::string& y_title, bool x_ticks);

struct LegendEntry {
  std::string label, color;
  bool dashed = false;
};
void draw_legend(std::string& s, const std::vector<LegendEntry>& entries);

// "M x y L x y ..." through the finite points. A non-finite value lifts the pen; a point
// without finite neighbours becomes a zero-length segment, which round caps draw as a dot.
std::string path_data(const Frame& f, const std::vector<double>& xs, const std::vector<double>& ys);
std::string curve_path(const std::string& cls, const std::string& mode, const std::string& stroke,
                       const std::string& d, const std::string& extra = "");

struct Bar {
  std::string mode;
  double value = 0;
  std::string label, note;  // above the bar: the value, and an optional second line above it
};
std::string bar_chart(const std::string& title, const std::string& y_title, const std::vector<Bar>& bars);

}  // namespace ptrain::svg
