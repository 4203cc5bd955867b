#include "metrics/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "metrics/run_log.h"

namespace ptrain {
namespace {

// ---- Text ----

constexpr const char* kAbsent = "—";

// printf of one number; NaN and infinities spelled out the same way on every platform.
std::string num(const char* format, double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
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

// Backslash-escapes Markdown punctuation, so that globs and paths ("data/*_train_*.bin") and
// table cells stay literal.
std::string md_escape(const std::string& s) {
  static constexpr std::string_view kSpecial = "\\`*_[]<>|#";
  std::string out;
  for (const char ch : s) {
    if (kSpecial.find(ch) != std::string_view::npos) out += '\\';
    out += ch;
  }
  return out;
}

// ---- SVG primitives ----

constexpr double kWidth = 720, kHeight = 400;
// The plot area; the legend sits to its right.
constexpr double kPlotLeft = 72, kPlotRight = 556, kPlotTop = 48, kPlotBottom = 340;
constexpr double kLegendX = 574;

const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
std::string color(size_t run_index) { return kPalette[run_index % std::size(kPalette)]; }

std::string coord(double v) { return num("%.2f", v); }

std::string text(double x, double y, const std::string& content, const std::string& cls, const char* anchor,
                 const std::string& extra = "") {
  return "<text class=\"" + cls + "\" x=\"" + coord(x) + "\" y=\"" + coord(y) + "\" text-anchor=\"" + anchor + "\"" +
         extra + ">" + xml_escape(content) + "</text>\n";
}

std::string line(double x1, double y1, double x2, double y2, const std::string& cls, const std::string& stroke,
                 const std::string& extra = "") {
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

// ---- Axes ----

// The smallest and largest finite values seen (lo > hi while there are none).
struct Extent {
  double lo = std::numeric_limits<double>::infinity(), hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    if (!std::isfinite(v)) return;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
};

// A range rounded out to whole ticks, the tick step being 1, 2 or 5 x 10^k.
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

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

// Data coordinates to SVG coordinates.
struct Frame {
  Axis x, y;
  double px(double v) const { return kPlotLeft + (v - x.lo) / (x.hi - x.lo) * (kPlotRight - kPlotLeft); }
  double py(double v) const { return kPlotBottom - (v - y.lo) / (y.hi - y.lo) * (kPlotBottom - kPlotTop); }
};

// Grid lines, both axes with ticks and labels, the axis titles. A bar chart's x axis has no
// ticks (its bars are labelled instead).
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

struct LegendEntry {
  std::string label, color;
  bool dashed = false;
};

void draw_legend(std::string& s, const std::vector<LegendEntry>& entries) {
  s += "<g class=\"legend\">\n";
  double y = kPlotTop + 8;
  for (const LegendEntry& e : entries) {
    s += line(kLegendX, y, kLegendX + 22, y, "legend-swatch", e.color,
              std::string(" stroke-width=\"3\"") + (e.dashed ? " stroke-dasharray=\"6 4\"" : ""));
    s += text(kLegendX + 28, y + 4, e.label, "legend-label", "start");
    y += 20;
  }
  s += "</g>\n";
}

// ---- Curves ----

// "M x y L x y ..." through the finite points. A non-finite value lifts the pen; a point
// without finite neighbours becomes a zero-length segment, which round caps draw as a dot.
std::string path_data(const Frame& f, const std::vector<int64_t>& steps, const std::vector<double>& values) {
  std::vector<std::vector<std::pair<double, double>>> pieces(1);
  for (size_t i = 0; i < steps.size(); ++i) {
    if (std::isfinite(values[i]))
      pieces.back().emplace_back(f.px(static_cast<double>(steps[i])), f.py(values[i]));
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
                       const std::string& d, const std::string& extra = "") {
  return "<path class=\"" + cls + "\" data-mode=\"" + xml_escape(mode) + "\" d=\"" + d + "\" fill=\"none\" stroke=\"" +
         stroke + "\" stroke-width=\"1.6\" stroke-linejoin=\"round\" stroke-linecap=\"round\"" + extra + "/>\n";
}

Extent step_extent(const std::vector<int64_t>& steps) {
  Extent e;
  for (const int64_t step : steps) e.add(static_cast<double>(step));
  return e;
}

// ---- Bar charts ----

struct Bar {
  std::string mode;
  double value = 0;
  std::string label, note;  // above the bar: the value, and an optional second line above it
};

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

// ---- The report's text ----

// What "peak memory" measured: a GPU's arena, the process's resident memory, or a mix.
std::string memory_kind(const Comparison& c) {
  size_t on_device = 0;
  for (const ModeResult& r : c.results) on_device += r.device_memory ? 1 : 0;
  if (on_device == 0) return "host resident memory";
  return on_device == c.results.size() ? "device memory" : "device memory on GPUs, else host";
}

std::string report_title(const Comparison& c) {
  std::string others;
  for (const ModeResult& r : c.results)
    if (r.mode != c.reference) others += (others.empty() ? "" : ", ") + r.mode;
  return "ptrain compare: " + c.reference + (others.empty() ? "" : " vs " + others);
}

// A config value by its flat key, as RunRecord::config holds them ("model.n_embd").
const nlohmann::json* config_find(const nlohmann::json& config, const std::string& key) {
  return config.is_object() && config.contains(key) ? &config.at(key) : nullptr;
}

// A config value as text: strings bare, anything else as JSON writes it, "?" when absent.
std::string config_text(const nlohmann::json& config, const std::string& dotted_key) {
  const nlohmann::json* node = config_find(config, dotted_key);
  if (!node) return "?";
  return node->is_string() ? node->get<std::string>() : node->dump();
}

// The lines above the table: what was trained, against what, and the verdict in one line.
std::vector<std::string> summary_lines(const Comparison& c) {
  const nlohmann::json config = c.runs.empty() ? nlohmann::json::object() : c.runs[0].config;
  const auto key = [&](const std::string& k) { return config_text(config, k); };
  const std::string data =
      config_find(config, "data.synthetic.vocab")
          ? "synthetic (vocab " + key("data.synthetic.vocab") + ", order " + key("data.synthetic.order") +
                ", branching " + key("data.synthetic.branching") + ", " + key("data.synthetic.tokens") +
                " tokens, seed " + key("data.synthetic.seed") + ")"
          : "shards (train " + key("data.train") + ", val " + key("data.val") + ")";
  const std::string llama = config_find(config, "model.n_kv_head")
                                ? "llama (n_kv_head " + key("model.n_kv_head") + ", mlp_hidden " + key("model.mlp_hidden") +
                                      ", rope_theta " + key("model.rope_theta") + ") "
                                : "";
  std::vector<std::string> lines = {
      "Config: model " + llama + "n_layer " + key("model.n_layer") + ", n_head " + key("model.n_head") + ", n_embd " +
          key("model.n_embd") + ", seq_len " + key("model.seq_len") + ", vocab_size " + key("model.vocab_size") +
          "; training " + key("training.steps") + " steps of " + key("training.batch_tokens") +
          " tokens; data " + data + "; seed " + key("run.seed") + ".",
      "Reference: " + c.reference + "; tolerance: " + num("%g", c.tolerance_pct) +
          "% (|val Δ%|, or |Δ%| of the training loss for runs without evaluations)."};
  std::string regressed;
  for (const ModeResult& r : c.results)
    if (!r.within_tolerance) regressed += (regressed.empty() ? "" : ", ") + r.mode;
  lines.push_back(regressed.empty() ? "Verdict: every mode is within tolerance of the reference."
                                    : "Verdict: regressed beyond the tolerance: " + regressed + ".");
  return lines;
}

std::vector<std::string> table_header() {
  return {"mode",          "final loss",    "Δ vs ref",
          "Δ%",            "final val loss", "val Δ%",
          "largest divergence (at step)",    "oracle gap",
          "tokens/s",      "speedup",       "peak memory MiB",
          "skipped steps", "FP8 underflow / saturation", "verdict"};
}

std::string verdict(const Comparison& c, const ModeResult& r) {
  if (r.mode == c.reference) return "reference";
  return r.within_tolerance ? "within tolerance" : "regressed";
}

std::string optional_num(const char* format, const std::optional<double>& v, double scale = 1) {
  return v ? num(format, *v * scale) : kAbsent;
}

std::vector<std::string> table_row(const Comparison& c, const ModeResult& r) {
  const bool ref = r.mode == c.reference;
  const std::string fp8 = r.fp8_underflow || r.fp8_saturation ? optional_num("%.3f%%", r.fp8_underflow, 100) + " / " +
                                                                    optional_num("%.3f%%", r.fp8_saturation, 100)
                                                              : kAbsent;
  return {r.mode,
          num("%.4f", r.final_loss),
          ref ? kAbsent : num("%+.4f", r.loss_diff),
          ref ? kAbsent : num("%+.2f%%", r.loss_diff_pct),
          optional_num("%.4f", r.final_val_loss),
          ref ? kAbsent : optional_num("%+.2f%%", r.val_diff_pct),
          ref ? kAbsent : num("%.4f", r.max_divergence) + " (step " + std::to_string(r.max_divergence_step) + ")",
          optional_num("%+.4f", r.oracle_gap),
          thousands(r.tokens_per_s),
          num("%.2fx", r.speedup),
          num("%.1f", r.peak_memory_mib),
          std::to_string(r.skipped_steps),
          fp8,
          verdict(c, r)};
}

// "How to read this": each column's meaning, as (term, explanation).
std::vector<std::pair<std::string, std::string>> glossary(const Comparison& c) {
  const std::string tol = num("%g", c.tolerance_pct) + "%";
  return {
      {"final loss, Δ vs ref, Δ%", "the last step's training loss (one batch, so noisy), and its difference to the "
                                   "reference's, absolute and in percent of it"},
      {"final val loss, val Δ%", "the last evaluation's loss on held-out data, and its difference to the reference's "
                                 "in percent; steadier than the training loss"},
      {"largest divergence (at step)", "the largest |training loss − reference's| over the steps both runs logged, "
                                       "and the step where it happened"},
      {"oracle gap", "final val loss minus the synthetic corpus's oracle loss, the lowest any model can reach "
                     "(synthetic data only)"},
      {"tokens/s, speedup", "median tokens per second over steps 2 to N (step 1 warms up), and its ratio to the "
                            "reference's"},
      {"peak memory MiB", "the peak of " + memory_kind(c)},
      {"skipped steps", "steps skipped by loss scaling because the gradients overflowed"},
      {"FP8 underflow / saturation", "worst over every FP8 tensor: the share of non-zero values flushed to zero, "
                                     "and the share clipped to the format's largest value"},
      {"verdict", "within tolerance when |val Δ%| ≤ " + tol + " (the training loss's |Δ%| when the run has no "
                  "evaluation), else regressed"},
  };
}

struct Chart {
  const char* name;  // file stem and Markdown alt text
  std::string (*svg)(const Comparison&);
};
const Chart kCharts[] = {{"loss", loss_chart_svg},
                         {"loss_diff", loss_diff_chart_svg},
                         {"throughput", throughput_chart_svg},
                         {"memory", memory_chart_svg}};

constexpr const char* kStyle = R"(body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1200px; margin: 2rem auto; padding: 0 1rem; line-height: 1.45; }
.table-wrap { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9rem; margin: 1rem 0; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.6rem; text-align: right; white-space: nowrap; }
th { background: #f2f2f2; }
th:first-child, td:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafafa; }
.regressed { color: #b3261e; font-weight: 600; }
.within { color: #1e7e34; font-weight: 600; }
figure { margin: 1.5rem 0; }
svg { max-width: 100%; height: auto; }
)";

}  // namespace

// ---- Charts ----

std::string loss_chart_svg(const Comparison& c) {
  Extent steps, losses;
  for (const RunRecord& r : c.runs) {
    for (const int64_t step : r.steps) steps.add(static_cast<double>(step));
    for (const int64_t step : r.val_steps) steps.add(static_cast<double>(step));
    for (const double v : r.loss) losses.add(v);
    for (const double v : r.val_loss) losses.add(v);
  }
  const Frame f{nice_axis(steps, true), nice_axis(losses, false)};
  const bool any_val =
      std::any_of(c.runs.begin(), c.runs.end(), [](const RunRecord& r) { return !r.val_steps.empty(); });
  std::string s = svg_open(any_val ? "Training and validation loss by step" : "Training loss by step");
  draw_axes(s, f, "step", "loss", true);
  std::vector<LegendEntry> legend;
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRecord& r = c.runs[i];
    s += curve_path("curve", r.mode, color(i), path_data(f, r.steps, r.loss));
    if (!r.val_steps.empty()) {
      s += curve_path("val-curve", r.mode, color(i), path_data(f, r.val_steps, r.val_loss),
                      " stroke-dasharray=\"6 4\"");
      for (size_t j = 0; j < r.val_steps.size(); ++j) {
        if (!std::isfinite(r.val_loss[j])) continue;
        s += "<circle class=\"val-point\" data-mode=\"" + xml_escape(r.mode) + "\" cx=\"" +
             coord(f.px(static_cast<double>(r.val_steps[j]))) + "\" cy=\"" + coord(f.py(r.val_loss[j])) +
             "\" r=\"3\" fill=\"" + color(i) + "\"/>\n";
      }
    }
    legend.push_back({r.mode, color(i), false});
  }
  if (any_val) legend.push_back({"val loss", "#555555", true});
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
    std::vector<int64_t> steps;
    std::vector<double> diff;  // not finite where either loss is not
  };
  std::vector<Curve> curves;
  Extent steps = step_extent(ref->steps);
  Extent diffs;
  diffs.add(0);  // the zero line is always in view
  for (size_t i = 0; i < c.runs.size(); ++i) {
    const RunRecord& r = c.runs[i];
    if (&r == ref) continue;
    Curve curve{i, {}, {}};
    for (size_t j = 0; j < r.steps.size(); ++j) {
      const auto it = reference.find(r.steps[j]);
      if (it == reference.end()) continue;
      curve.steps.push_back(r.steps[j]);
      curve.diff.push_back(r.loss[j] - it->second);
      steps.add(static_cast<double>(r.steps[j]));
      diffs.add(curve.diff.back());
    }
    curves.push_back(std::move(curve));
  }
  const Frame f{nice_axis(steps, true), nice_axis(diffs, false)};
  std::string s = svg_open("Training loss minus " + c.reference + "'s");
  draw_axes(s, f, "step", "loss − " + c.reference + " loss", true);
  s += line(kPlotLeft, f.py(0), kPlotRight, f.py(0), "zero", "#333333", " stroke-dasharray=\"4 3\"");
  std::vector<LegendEntry> legend;
  for (const Curve& curve : curves) {
    const std::string& mode = c.runs[curve.run].mode;
    s += curve_path("curve", mode, color(curve.run), path_data(f, curve.steps, curve.diff));
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

// ---- Markdown and HTML ----

std::string report_markdown_table(const Comparison& c) {
  const auto row = [](const std::vector<std::string>& cells) {
    std::string out = "|";
    for (const std::string& cell : cells) out += " " + md_escape(cell) + " |";
    return out + "\n";
  };
  std::string out = row(table_header()) + "|:---|";
  for (size_t i = 1; i < table_header().size(); ++i) out += "---:|";
  out += "\n";
  for (const ModeResult& r : c.results) out += row(table_row(c, r));
  return out;
}

std::string report_markdown(const Comparison& c) {
  std::string out = "# " + md_escape(report_title(c)) + "\n\n";
  for (const std::string& sentence : summary_lines(c)) out += md_escape(sentence) + "\n\n";
  out += report_markdown_table(c) + "\n";
  for (const Chart& chart : kCharts) out += std::string("![") + chart.name + "](" + chart.name + ".svg)\n\n";
  out += "## How to read this\n\n";
  for (const auto& [term, meaning] : glossary(c)) out += "- **" + md_escape(term) + "**: " + md_escape(meaning) + "\n";
  out += "\n## Runs\n\n";
  for (const RunRecord& r : c.runs) out += "- " + md_escape(r.mode) + ": " + md_escape(r.dir) + "\n";
  return out;
}

std::string report_html(const Comparison& c) {
  const std::string title = xml_escape(report_title(c));
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" + title +
                    "</title>\n<style>\n" + kStyle + "</style>\n</head>\n<body>\n<h1>" + title + "</h1>\n";
  for (const std::string& sentence : summary_lines(c)) out += "<p>" + xml_escape(sentence) + "</p>\n";

  out += "<div class=\"table-wrap\">\n<table>\n<thead>\n<tr>";
  for (const std::string& cell : table_header()) out += "<th>" + xml_escape(cell) + "</th>";
  out += "</tr>\n</thead>\n<tbody>\n";
  for (const ModeResult& r : c.results) {
    const std::vector<std::string> cells = table_row(c, r);
    out += "<tr>";
    for (size_t i = 0; i + 1 < cells.size(); ++i) out += "<td>" + xml_escape(cells[i]) + "</td>";
    const std::string cls = r.mode == c.reference ? "reference" : r.within_tolerance ? "within" : "regressed";
    out += "<td class=\"" + cls + "\">" + xml_escape(cells.back()) + "</td></tr>\n";
  }
  out += "</tbody>\n</table>\n</div>\n";

  for (const Chart& chart : kCharts) {
    const std::string svg = chart.svg(c);
    out += "<figure>\n" + svg.substr(svg.find("<svg")) + "</figure>\n";  // without the XML declaration
  }

  out += "<h2>How to read this</h2>\n<ul>\n";
  for (const auto& [term, meaning] : glossary(c))
    out += "<li><b>" + xml_escape(term) + "</b>: " + xml_escape(meaning) + "</li>\n";
  out += "</ul>\n<h2>Runs</h2>\n<ul>\n";
  for (const RunRecord& r : c.runs)
    out += "<li>" + xml_escape(r.mode) + ": <code>" + xml_escape(r.dir) + "</code></li>\n";
  return out + "</ul>\n</body>\n</html>\n";
}

std::vector<std::string> write_report(const Comparison& c, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) throw UserError("cannot create the report directory " + out_dir + ": " + error.message());

  std::vector<std::pair<std::string, std::string>> files = {{"report.md", report_markdown(c)},
                                                             {"report.html", report_html(c)}};
  for (const Chart& chart : kCharts) files.emplace_back(std::string(chart.name) + ".svg", chart.svg(c));

  std::vector<std::string> written;
  for (const auto& [name, content] : files) {
    const std::string path = (fs::path(out_dir) / name).string();
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    if (!out) throw UserError("cannot write " + path);
    written.push_back(path);
  }
  return written;
}

}  // namespace ptrain
