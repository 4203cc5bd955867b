// The compare report's text: the verdict paragraph, the tables, the glossary, and the Markdown
// and HTML documents around the charts (metrics/report_charts.cpp).
#include "metrics/report.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "core/format.h"
#include "core/output_file.h"
#include "metrics/run_log.h"
#include "metrics/svg_chart.h"

namespace ptrain {

using svg::num;
using svg::thousands;
using svg::xml_escape;

namespace {

constexpr const char* kAbsent = "—";

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

// "0.42 s", "52.1 s", "3m07s".
std::string duration(double seconds) {
  if (seconds < 1) return num("%.2f s", seconds);
  if (seconds < 60) return num("%.1f s", seconds);
  return format_duration(seconds);
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

// "fp32's final val loss (1.9269)", or "the target val loss 1.9" given by --target-loss.
std::string target_phrase(const Comparison& c) {
  const std::string value = num("%.4f", *c.target_loss);
  return c.target_given ? "the target val loss " + value : c.reference + "'s final val loss (" + value + ")";
}

// The data-parallel ranks a run trained on (its GPU plan is per rank), when more than one.
std::string ranks_note(const RunRecord& r) { return r.ranks > 1 ? " (" + std::to_string(r.ranks) + " ranks)" : ""; }

// "0.04% higher", "1.2% lower", "the same".
std::string relative_change(double pct) {
  if (!std::isfinite(pct)) return num("%g", pct) + "% different";
  if (std::fabs(pct) < 0.005) return "the same";
  return num(std::fabs(pct) < 10 ? "%.2f%%" : "%.0f%%", std::fabs(pct)) + (pct > 0 ? " higher" : " lower");
}

// The verdict's clause on time to target, for one mode other than the reference.
std::string time_clause(const Comparison& c, const ModeResult& r, const ModeResult& ref, const RunRecord& run) {
  if (run.val_steps.empty()) return r.mode + " ran no evaluation, so it has no time to " + target_phrase(c);
  if (!r.time_to_target_s) {
    double lowest = INFINITY;
    for (const double v : run.val_loss)
      if (std::isfinite(v)) lowest = std::min(lowest, v);
    return r.mode + " never reached " + target_phrase(c) + " in its " + std::to_string(run.steps.back()) + " steps (" +
           (std::isfinite(lowest) ? "its lowest val loss: " + num("%.4f", lowest) : std::string("no finite val loss")) +
           ")";
  }
  const std::string after = duration(*r.time_to_target_s) + " of training";
  if (!ref.time_to_target_s)
    return r.mode + " reached " + target_phrase(c) + " after " + after + ", where " + c.reference +
           (c.runs.front().val_steps.empty() ? " ran no evaluation" : " never did");
  if (*ref.time_to_target_s == 0)
    return r.mode + " reached " + target_phrase(c) + " after " + after + "; " + c.reference +
           " already met it at step 0, before any training";
  if (!r.target_speedup) return r.mode + " reached " + target_phrase(c) + " at step 0, before any training";
  const std::string times = " (" + after + " against " + duration(*ref.time_to_target_s) + ")";
  const double s = *r.target_speedup;
  if (std::fabs(s - 1) < 0.005) return r.mode + " reached " + target_phrase(c) + " in the same training time as " + c.reference + times;
  if (s > 1) return r.mode + " reached " + target_phrase(c) + " " + num("%.2fx", s) + " sooner than " + c.reference + times;
  return r.mode + " reached " + target_phrase(c) + " only after " + num("%.2fx", 1 / s) + " " + c.reference +
         "'s training time" + times;
}

std::vector<std::string> summary_lines(const Comparison& c) {
  const nlohmann::json config = c.runs.empty() ? nlohmann::json::object() : c.runs[0].config;
  const auto key = [&](const std::string& k) { return config_text(config, k); };
  const std::string data =
      config_find(config, "data.synthetic.vocab")
          ? "synthetic (vocab " + key("data.synthetic.vocab") + ", order " + key("data.synthetic.order") +
                ", branching " + key("data.synthetic.branching") + ", " + key("data.synthetic.tokens") +
                " tokens, seed " + key("data.synthetic.seed") + ")"
          : "shards (train " + (config_find(config, "data.sources") ? key("data.sources") : key("data.train")) +
                ", val " + key("data.val") + ")";
  const std::string llama = config_find(config, "model.n_kv_head")
                                ? "llama (n_kv_head " + key("model.n_kv_head") + ", mlp_hidden " + key("model.mlp_hidden") +
                                      ", rope_theta " + key("model.rope_theta") + ") "
                                : "";
  return {"Config: model " + llama + "n_layer " + key("model.n_layer") + ", n_head " + key("model.n_head") + ", n_embd " +
              key("model.n_embd") + ", seq_len " + key("model.seq_len") + ", vocab_size " + key("model.vocab_size") +
              "; training " + key("training.steps") + " steps of " + key("training.batch_tokens") +
              " tokens; data " + data + "; seed " + key("run.seed") + ".",
          "Reference: " + c.reference + "; tolerance: " + num("%g", c.tolerance_pct) +
              "% (|val Δ%|, or |Δ%| of the training loss for runs without evaluations); time to target: " +
              (c.target_loss ? target_phrase(c)
                             : std::string(c.runs.empty() || c.runs[0].val_steps.empty()
                                               ? "none (the reference ran no evaluation)"
                                               : "none (the reference's final val loss is not finite)")) +
              "."};
}

std::string verdict(const Comparison& c, const ModeResult& r) {
  if (r.mode == c.reference) return "reference";
  return r.within_tolerance ? "within tolerance" : "regressed";
}

std::string optional_num(const char* format, const std::optional<double>& v, double scale = 1) {
  return v ? num(format, *v * scale) : kAbsent;
}

// The report's two tables: what each mode's numerics cost, and what it bought.
struct Table {
  const char* title;
  std::vector<std::string> (*header)(const Comparison&);
  std::vector<std::string> (*row)(const Comparison&, const ModeResult&, const RunRecord&);
};

std::vector<std::string> quality_header(const Comparison& c) {
  std::vector<std::string> h = {"mode",   "final loss", "Δ vs ref", "Δ%", "final val loss", "val Δ%",
                                "largest divergence (at step)", "oracle gap"};
  if (c.int8_evaluated) h.push_back("INT8 weights val Δ%");
  h.push_back("verdict");
  return h;
}

std::vector<std::string> quality_row(const Comparison& c, const ModeResult& r, const RunRecord&) {
  const bool ref = r.mode == c.reference;
  std::vector<std::string> cells = {r.mode,
          num("%.4f", r.final_loss),
          ref ? kAbsent : num("%+.4f", r.loss_diff),
          ref ? kAbsent : num("%+.2f%%", r.loss_diff_pct),
          optional_num("%.4f", r.final_val_loss),
          ref ? kAbsent : optional_num("%+.2f%%", r.val_diff_pct),
          ref ? kAbsent : num("%.4f", r.max_divergence) + " (step " + std::to_string(r.max_divergence_step) + ")",
          optional_num("%+.4f", r.oracle_gap)};
  if (c.int8_evaluated) cells.push_back(optional_num("%+.3f%%", r.int8_diff_pct));
  cells.push_back(verdict(c, r));
  return cells;
}

// The measured peak's column: what the runs measured it of.
std::string measured_memory_header(const Comparison& c) {
  const std::string kind = memory_kind(c);
  if (kind == "host resident memory") return "peak host memory MiB";
  return kind == "device memory" ? "peak device memory MiB" : "peak memory MiB (device, else host)";
}

std::vector<std::string> speed_header(const Comparison& c) {
  return {"mode",     "training time", "time to target",  "tokens to target", "speedup to target",
          "tokens/s", "speedup",       measured_memory_header(c), "GPU plan MiB per rank",
          "GPU plan B/param without activations", "skipped steps",    "FP8 underflow / saturation"};
}

std::vector<std::string> speed_row(const Comparison& c, const ModeResult& r, const RunRecord& run) {
  // "never" is a result; "—" says there is nothing to measure (no target, or no evaluations).
  const bool measurable = c.target_loss && !run.val_steps.empty();
  const auto to_target = [&](const std::optional<double>& v, std::string (*format)(double)) {
    return v ? format(*v) : measurable ? "never" : kAbsent;
  };
  const std::string fp8 = r.fp8_underflow || r.fp8_saturation ? optional_num("%.3f%%", r.fp8_underflow, 100) + " / " +
                                                                    optional_num("%.3f%%", r.fp8_saturation, 100)
                                                              : kAbsent;
  return {r.mode,
          duration(r.train_seconds),
          to_target(r.time_to_target_s, duration),
          to_target(r.tokens_to_target, [](double v) { return thousands(v); }),
          optional_num("%.2fx", r.target_speedup),
          thousands(r.tokens_per_s),
          num("%.2fx", r.speedup),
          num("%.1f", r.peak_memory_mib),
          optional_num("%.1f", r.gpu_plan_mib),
          optional_num("%.2f", r.gpu_plan_state_bytes_per_param),
          std::to_string(r.skipped_steps),
          fp8};
}

const Table kTables[] = {{"Quality", quality_header, quality_row}, {"Speed and memory", speed_header, speed_row}};

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
      {"verdict", "within tolerance when |val Δ%| ≤ " + tol + " (the training loss's |Δ%| when the run has no "
                  "evaluation), else regressed"},
      {"INT8 weights val Δ%", "with --int8-eval: the final checkpoint's val loss with its block linears' weights "
                              "quantized to INT8 (symmetric, per output channel, weight-only), against the same "
                              "checkpoint's loss with its FP32 master weights; both computed in FP32"},
      {"training time", "the sum of the step times: evaluations, checkpoint saves and start-up left out, and the "
                        "segments of a resumed run added up"},
      {"time to target, tokens to target", "the training time and the tokens until the val loss first reached the "
                                           "target; between the evaluation before the crossing and the one at or "
                                           "below the target, linearly interpolated (in steps, then in time within "
                                           "the step). \"never\": no evaluation reached it"},
      {"speedup to target", "the reference's time to target divided by this mode's"},
      {"tokens/s, speedup", "median tokens per second over steps 2 to N (step 1 warms up), and its ratio to the "
                            "reference's"},
      {measured_memory_header(c), "the measured peak of " + memory_kind(c) +
                                      (memory_kind(c) == "host resident memory"
                                           ? " (the CPU backend stores the narrow formats in FP32, so this is not "
                                             "what a mode saves on a GPU)"
                                           : "")},
      {"GPU plan MiB per rank", "what the CUDA backend's arena would hold per rank for this run's shape, ranks and "
                                "ZeRO stage (one rank unless the list of runs below says more), planned as `ptrain train "
                                "--dry-run` plans it (weights, FP8 weight codes, FP32 master, FP32 gradients, "
                                "AdamW state, activations, FP8 operand codes, backend scratch; cuDNN's attention "
                                "workspace left out), whichever device the run took; — where the CUDA backend would refuse the "
                                "config (model.attention: cudnn with FP32 activations)"},
      {"GPU plan B/param without activations", "the plan's weights (with their FP8 codes), FP32 master weights, "
                                               "FP32 gradients and AdamW state per model parameter, as Megatron and "
                                               "ZeRO count them"},
      {"skipped steps", "steps skipped by loss scaling because the gradients overflowed"},
      {"FP8 underflow / saturation", "worst over every FP8 tensor: the share of non-zero values flushed to zero, "
                                     "and the share clipped to the format's largest value"},
      {"charts", "training loss is drawn smoothed by an exponential moving average (β = " + num("%g", kLossEmaBeta) +
                     ", debiased so it starts at the first step's loss), the raw values faint behind it; validation "
                     "losses are the dots"},
  };
}

struct Chart {
  const char* name;  // file stem and Markdown alt text
  std::string (*svg)(const Comparison&);
};
const Chart kCharts[] = {{"loss", loss_chart_svg},
                         {"loss_time", loss_time_chart_svg},
                         {"loss_diff", loss_diff_chart_svg},
                         {"throughput", throughput_chart_svg},
                         {"memory", memory_chart_svg}};

// Fits 1400 px without horizontal scrolling (charts two to a row, tables whose headers wrap);
// on a phone the charts stack and a table scrolls inside its box with the mode column kept.
constexpr const char* kStyle = R"(body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: #222;
       max-width: 1440px; margin: 1.5rem auto; padding: 0 1rem; line-height: 1.45; }
p, li { overflow-wrap: anywhere; }
.verdict { font-size: 1.05rem; background: #f4f7fb; border-left: 4px solid #1f77b4; padding: 0.6rem 0.9rem; }
.table-wrap { overflow-x: auto; max-width: 100%; }
table { border-collapse: separate; border-spacing: 0; font-size: 0.9rem; margin: 0.5rem 0 1rem; }
th, td { border-bottom: 1px solid #ddd; border-right: 1px solid #eee; padding: 0.3rem 0.6rem; text-align: right;
         white-space: nowrap; background: #fff; }
th { background: #f2f2f2; white-space: normal; vertical-align: bottom; min-width: 4.5rem; }
th:first-child, td:first-child { text-align: left; position: sticky; left: 0; z-index: 1; border-right: 1px solid #bbb; }
th:first-child { background: #f2f2f2; }
tbody tr:nth-child(even) td { background: #fafafa; }
.regressed { color: #b3261e; font-weight: 600; }
.within { color: #1e7e34; font-weight: 600; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(min(100%, 560px), 1fr)); gap: 1rem; }
figure { margin: 0; }
svg { display: block; width: 100%; height: auto; }
@media (max-width: 640px) {
  body { margin: 0.75rem auto; padding: 0 0.6rem; }
  h1 { font-size: 1.35rem; }
  table { font-size: 0.82rem; }
}
)";

}  // namespace

std::string verdict_paragraph(const Comparison& c) {
  const ModeResult& ref = c.results.front();  // compare_runs puts the reference first
  std::string out;
  for (size_t i = 1; i < c.results.size(); ++i) {
    const ModeResult& r = c.results[i];
    std::vector<std::string> clauses;
    if (c.target_loss) clauses.push_back(time_clause(c, r, ref, c.runs[i]));
    const std::string whose = clauses.empty() ? r.mode + "'s " : "its ";
    if (r.val_diff_pct)
      clauses.push_back(whose + "final val loss is " + relative_change(*r.val_diff_pct));
    else
      clauses.push_back(whose + "final training loss is " + relative_change(r.loss_diff_pct));
    if (ref.gpu_plan_mib && r.gpu_plan_mib && *ref.gpu_plan_mib > 0)
      clauses.push_back("its GPU memory plan is " +
                        relative_change(100 * (*r.gpu_plan_mib - *ref.gpu_plan_mib) / *ref.gpu_plan_mib) + " (" +
                        num("%.1f", *r.gpu_plan_mib) + " MiB per rank against " + num("%.1f", *ref.gpu_plan_mib) +
                        "; " + num("%.2f", *r.gpu_plan_state_bytes_per_param) + " bytes per parameter against " +
                        num("%.2f", *ref.gpu_plan_state_bytes_per_param) + " without activations)");
    if (ref.peak_memory_mib > 0 && r.peak_memory_mib > 0)
      clauses.push_back("measured " + memory_kind(c) + " " +
                        relative_change(100 * (r.peak_memory_mib - ref.peak_memory_mib) / ref.peak_memory_mib));
    clauses.push_back("throughput " + num("%.2fx", r.speedup) + " " + c.reference + "'s");
    std::string sentence;
    for (const std::string& clause : clauses) sentence += (sentence.empty() ? "" : "; ") + clause;
    out += (out.empty() ? "" : " ") + sentence + ".";
  }
  std::string regressed;
  for (const ModeResult& r : c.results)
    if (!r.within_tolerance) regressed += (regressed.empty() ? "" : ", ") + r.mode;
  const std::string tol = num("%g", c.tolerance_pct) + "%";
  out += regressed.empty() ? " Every mode is within the " + tol + " tolerance."
                           : " Regressed beyond the " + tol + " tolerance: " + regressed + ".";
  if (c.int8_evaluated) {
    std::string each;
    for (const ModeResult& r : c.results)
      each += (each.empty() ? "" : ", ") + optional_num("%+.3f%%", r.int8_diff_pct) + " (" + r.mode + ")";
    out += " INT8 weights (weight-only, per output channel) change the final checkpoints' val loss by " + each + ".";
  }
  if (c.target_loss && !c.runs.front().val_steps.empty()) {
    const std::string every = config_text(c.runs.front().config, "training.eval_every");
    out += every == "0" ? " Times to target are those of the final evaluation (training.eval_every: 0)."
                        : " Times to target are interpolated between evaluations, every " + every + " steps.";
  }
  return out;
}

std::string report_markdown_summary(const Comparison& c) {
  std::string out = "**Verdict.** " + md_escape(verdict_paragraph(c)) + "\n";
  for (const Table& t : kTables) {
    const auto row = [](const std::vector<std::string>& cells) {
      std::string line = "|";
      for (const std::string& cell : cells) line += " " + md_escape(cell) + " |";
      return line + "\n";
    };
    const std::vector<std::string> header = t.header(c);
    out += std::string("\n## ") + t.title + "\n\n" + row(header) + "|:---|";
    for (size_t i = 1; i < header.size(); ++i) out += "---:|";
    out += "\n";
    for (size_t i = 0; i < c.results.size(); ++i) out += row(t.row(c, c.results[i], c.runs[i]));
  }
  return out;
}

std::string report_markdown(const Comparison& c) {
  std::string out = "# " + md_escape(report_title(c)) + "\n\n";
  const std::string summary = report_markdown_summary(c);
  const size_t tables = summary.find("\n## ");
  out += summary.substr(0, tables) + "\n";  // the verdict first, then what was compared
  for (const std::string& sentence : summary_lines(c)) out += md_escape(sentence) + "\n\n";
  out += summary.substr(tables + 1) + "\n## Charts\n\n";
  for (const Chart& chart : kCharts) out += std::string("![") + chart.name + "](" + chart.name + ".svg)\n\n";
  out += "## How to read this\n\n";
  for (const auto& [term, meaning] : glossary(c)) out += "- **" + md_escape(term) + "**: " + md_escape(meaning) + "\n";
  out += "\n## Runs\n\n";
  for (const RunRecord& r : c.runs) out += "- " + md_escape(r.mode) + ": " + md_escape(r.dir) + ranks_note(r) + "\n";
  return out;
}

std::string report_html(const Comparison& c) {
  const std::string title = xml_escape(report_title(c));
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                    "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
                    title + "</title>\n<style>\n" + kStyle + "</style>\n</head>\n<body>\n<h1>" + title + "</h1>\n";
  out += "<p class=\"verdict\"><b>Verdict.</b> " + xml_escape(verdict_paragraph(c)) + "</p>\n";
  for (const std::string& sentence : summary_lines(c)) out += "<p>" + xml_escape(sentence) + "</p>\n";

  for (const Table& t : kTables) {
    const std::vector<std::string> header = t.header(c);
    out += std::string("<h2>") + t.title + "</h2>\n<div class=\"table-wrap\">\n<table>\n<thead>\n<tr>";
    for (const std::string& cell : header) out += "<th>" + xml_escape(cell) + "</th>";
    out += "</tr>\n</thead>\n<tbody>\n";
    for (size_t i = 0; i < c.results.size(); ++i) {
      const ModeResult& r = c.results[i];
      const std::vector<std::string> cells = t.row(c, r, c.runs[i]);
      out += "<tr>";
      for (size_t j = 0; j < cells.size(); ++j) {
        const bool verdict_cell = header[j] == "verdict";
        const std::string cls = r.mode == c.reference ? "reference" : r.within_tolerance ? "within" : "regressed";
        out += (verdict_cell ? "<td class=\"" + cls + "\">" : std::string("<td>")) + xml_escape(cells[j]) + "</td>";
      }
      out += "</tr>\n";
    }
    out += "</tbody>\n</table>\n</div>\n";
  }

  out += "<h2>Charts</h2>\n<div class=\"charts\">\n";
  for (const Chart& chart : kCharts) {
    const std::string svg = chart.svg(c);
    out += "<figure>\n" + svg.substr(svg.find("<svg")) + "</figure>\n";  // without the XML declaration
  }
  out += "</div>\n<h2>How to read this</h2>\n<ul>\n";
  for (const auto& [term, meaning] : glossary(c))
    out += "<li><b>" + xml_escape(term) + "</b>: " + xml_escape(meaning) + "</li>\n";
  out += "</ul>\n<h2>Runs</h2>\n<ul>\n";
  for (const RunRecord& r : c.runs)
    out += "<li>" + xml_escape(r.mode) + ": <code>" + xml_escape(r.dir) + "</code>" + xml_escape(ranks_note(r)) + "</li>\n";
  return out + "</ul>\n</body>\n</html>\n";
}

std::vector<std::string> write_report(const Comparison& c, const std::string& out_dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(out_dir, error);
  if (error) throw EnvironmentError("cannot create the report directory " + out_dir + ": " + error.message());

  std::vector<std::pair<std::string, std::string>> files = {{"report.md", report_markdown(c)},
                                                             {"report.html", report_html(c)}};
  for (const Chart& chart : kCharts) files.emplace_back(std::string(chart.name) + ".svg", chart.svg(c));

  std::vector<std::string> written;
  for (const auto& [name, content] : files) {
    const std::string path = (fs::path(out_dir) / name).string();
    write_file_atomic(path, content);
    written.push_back(path);
  }
  return written;
}

}  // namespace ptrain
