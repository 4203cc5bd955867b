// `ptrain compare`: a config trained in several modes through the real binary, the report's
// numbers recomputed here from the runs' metrics.jsonl, the SVG charts checked element by element,
// runs that differ in more than precision refused, and --fail-on-regression's exit code.
// (tests/report_in_chromium.sh opens the HTML report in headless Chromium.)
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "metrics/compare.h"
#include "test_util.h"

namespace ptrain::test {
namespace {

namespace fs = std::filesystem;


// A small GPT on a synthetic corpus, 6 steps with two evaluations; `precision` is a YAML mapping.
std::string tiny_config(const std::string& name, const std::string& precision = "{mode: fp32}", int n_embd = 64) {
  return "run: {name: " + name + ", out_dir: runs, seed: 3, device: cpu}\n"
         "model: {n_layer: 2, n_head: 4, n_embd: " + std::to_string(n_embd) + ", seq_len: 32, vocab_size: 64}\n"
         "data: {synthetic: {vocab: 64, order: 2, branching: 4, tokens: 60000, seed: 5}}\n"
         "training: {steps: 6, batch_tokens: 256, micro_batch: 8, eval_every: 3, eval_batches: 2, threads: 1}\n"
         "optimizer: {lr: 1.0e-3}\n"
         "schedule: {warmup_steps: 2}\n"
         "precision: " + precision + "\n"
         "checkpoint: {save_final: false}\n";
}

nlohmann::json read_json_file(const fs::path& p) { return nlohmann::json::parse(read_file(p)); }

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

// What a run's metrics.jsonl says, read here without ptrain's own reader.
struct Metrics {
  std::map<int64_t, double> loss, tokens_per_s, val_loss;
};
Metrics metrics_of(const fs::path& run_dir) {
  Metrics m;
  for (const auto& r : read_metrics(run_dir / "metrics.jsonl")) {
    if (!r.contains("step")) continue;
    const int64_t step = r["step"].get<int64_t>();
    if (r.contains("loss")) m.loss[step] = r["loss"].get<double>();
    if (r.contains("tokens_per_s")) m.tokens_per_s[step] = r["tokens_per_s"].get<double>();
    if (r.contains("val_loss")) m.val_loss[step] = r["val_loss"].get<double>();
  }
  return m;
}

double median_from_step_2(const std::map<int64_t, double>& per_step) {
  std::vector<double> v;
  for (const auto& [step, x] : per_step)
    if (step >= 2) v.push_back(x);
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// The values of attribute `attr` on the elements whose opening tag contains `marker`.
std::vector<std::string> attribute_values(const std::string& svg, const std::string& marker, const std::string& attr) {
  std::vector<std::string> out;
  for (size_t at = svg.find(marker); at != std::string::npos; at = svg.find(marker, at + 1)) {
    const size_t tag_start = svg.rfind('<', at), tag_end = svg.find('>', at);
    const std::string tag = svg.substr(tag_start, tag_end - tag_start);
    const size_t a = tag.find(attr + "=\"");
    if (a != std::string::npos) out.push_back(tag.substr(a + attr.size() + 2, tag.find('"', a + attr.size() + 2) - a - attr.size() - 2));
  }
  return out;
}

// XML well-formedness as far as SVG needs it: one root <svg>, every element closed in order,
// attributes quoted, no stray '<' or '&' in text.
bool well_formed_svg(const std::string& svg, std::string* why) {
  std::vector<std::string> open;
  size_t i = svg.rfind("?>", 200);
  i = i == std::string::npos ? 0 : i + 2;
  bool seen_root = false;
  while (true) {
    const size_t lt = svg.find('<', i);
    const std::string text = svg.substr(i, lt == std::string::npos ? std::string::npos : lt - i);
    for (size_t amp = text.find('&'); amp != std::string::npos; amp = text.find('&', amp + 1))
      if (text.compare(amp, 4, "&lt;") && text.compare(amp, 4, "&gt;") && text.compare(amp, 5, "&amp;") &&
          text.compare(amp, 6, "&quot;") && text.compare(amp, 6, "&apos;") && text.compare(amp, 2, "&#"))
        return *why = "an unescaped '&' in text", false;
    if (lt == std::string::npos) break;
    const size_t gt = svg.find('>', lt);
    if (gt == std::string::npos) return *why = "an unclosed tag", false;
    std::string tag = svg.substr(lt + 1, gt - lt - 1);
    if (count_of(tag, "\"") % 2) return *why = "an attribute quote left open in <" + tag + ">", false;
    if (tag.rfind("!--", 0) == 0) {
    } else if (tag[0] == '/') {
      if (open.empty() || open.back() != tag.substr(1)) return *why = "</" + tag.substr(1) + "> closes nothing open", false;
      open.pop_back();
    } else {
      const std::string name = tag.substr(0, tag.find_first_of(" \n\t/"));
      if (open.empty() && (seen_root || name != "svg")) return *why = "content outside the one <svg> root", false;
      seen_root = true;
      if (tag.back() != '/') open.push_back(name);
    }
    i = gt + 1;
  }
  if (!open.empty()) return *why = "<" + open.back() + "> never closed", false;
  return seen_root || (*why = "no <svg>", false);
}

TEST_CASE("compare trains each mode, and the report's numbers are those of the runs' metrics", "[compare]") {
  TempDir ws("compare");
  write_file(ws.dir / "tiny.yaml", tiny_config("tiny"));
  const CommandResult r = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(r.output.find("report: out/report.md") != std::string::npos);
  for (const char* f : {"report.md", "report.html", "loss.svg", "loss_diff.svg", "throughput.svg", "memory.svg"})
    CHECK(fs::file_size(ws.dir / "out" / f) > 0);

  const fs::path fp32_dir = ws.dir / "out/runs/tiny-fp32", bf16_dir = ws.dir / "out/runs/tiny-bf16";
  const Metrics a = metrics_of(fp32_dir), b = metrics_of(bf16_dir);
  REQUIRE(a.loss.size() == 6);
  REQUIRE(b.loss.size() == 6);
  REQUIRE(a.val_loss.size() == 3);  // steps 0, 3 and 6
  const double loss_diff = b.loss.at(6) - a.loss.at(6);
  const double val_diff_pct = 100.0 * (b.val_loss.at(6) - a.val_loss.at(6)) / a.val_loss.at(6);
  double divergence = 0;
  int64_t divergence_step = 0;
  for (const auto& [step, loss] : b.loss)
    if (std::fabs(loss - a.loss.at(step)) > divergence) {
      divergence = std::fabs(loss - a.loss.at(step));
      divergence_step = step;
    }
  const double speedup = median_from_step_2(b.tokens_per_s) / median_from_step_2(a.tokens_per_s);

  const Comparison c = compare_runs({read_run(fp32_dir.string()), read_run(bf16_dir.string())}, "fp32", 2.0);
  REQUIRE(c.results.size() == 2);
  const ModeResult& m = c.results[1];
  CHECK(m.mode == "bf16");
  CHECK(m.final_loss == b.loss.at(6));
  CHECK(m.loss_diff == loss_diff);
  CHECK(*m.final_val_loss == b.val_loss.at(6));
  CHECK(*m.val_diff_pct == Approx(val_diff_pct).epsilon(1e-12));
  CHECK(m.max_divergence == divergence);
  CHECK(m.max_divergence_step == divergence_step);
  CHECK(m.tokens_per_s == median_from_step_2(b.tokens_per_s));
  CHECK(m.speedup == Approx(speedup).epsilon(1e-12));
  const double oracle = read_json_file(bf16_dir / "summary.json")["oracle_loss"].get<double>();
  CHECK(*m.oracle_gap == b.val_loss.at(6) - oracle);
  CHECK(m.within_tolerance == (std::fabs(val_diff_pct) <= 2.0));

  // The Markdown table shows those numbers, on the bf16 row.
  const std::string md = read_file(ws.dir / "out/report.md");
  const size_t row = md.find("| bf16");
  REQUIRE(row != std::string::npos);
  const std::string bf16_row = md.substr(row, md.find('\n', row) - row);
  INFO(bf16_row);
  CHECK(bf16_row.find(fmt("%.4f", b.loss.at(6))) != std::string::npos);
  CHECK(bf16_row.find(fmt("%+.4f", loss_diff)) != std::string::npos);
  CHECK(bf16_row.find(fmt("%+.2f%%", val_diff_pct)) != std::string::npos);
  CHECK(bf16_row.find(fmt("%.2fx", speedup)) != std::string::npos);
  CHECK(bf16_row.find(fmt("(step %.0f)", static_cast<double>(divergence_step))) != std::string::npos);

  // A second compare finds both runs finished and trains nothing.
  const CommandResult again = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out", ws.dir);
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK(count_of(again.output, "reusing the finished run") == 2);
  CHECK(read_file(ws.dir / "out/report.md") == md);
}

TEST_CASE("compare of run directories: well-formed charts with one curve per mode, and the verdict's exit code",
          "[compare]") {
  TempDir ws("compare");
  const std::vector<std::pair<std::string, std::string>> modes = {
      {"fp32", "{mode: fp32}"}, {"bf16", "{mode: bf16}"}, {"fp8:delayed", "{mode: fp8, fp8: {recipe: delayed}}"}};
  std::string dirs;
  for (const auto& [mode, precision] : modes) {
    std::string name = "run-" + mode.substr(0, mode.find(':'));
    write_file(ws.dir / (name + ".yaml"), tiny_config(name, precision));
    const CommandResult r = run_ptrain("train " + name + ".yaml", ws.dir);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    dirs += " runs/" + name;
  }
  const CommandResult r = run_ptrain("compare" + dirs + " --out report", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);

  const std::set<std::string> all = {"fp32", "bf16", "fp8:delayed"}, others = {"bf16", "fp8:delayed"};
  struct Chart {
    const char* file;
    const char* marker;
    std::set<std::string> modes;
  };
  for (const Chart& chart : {Chart{"loss.svg", "class=\"curve\"", all}, Chart{"loss_diff.svg", "class=\"curve\"", others},
                             Chart{"throughput.svg", "class=\"bar\"", all}, Chart{"memory.svg", "class=\"bar\"", all}}) {
    INFO(chart.file);
    const std::string svg = read_file(ws.dir / "report" / chart.file);
    std::string why;
    CHECK(well_formed_svg(svg, &why));
    INFO(why);
    const std::vector<std::string> found = attribute_values(svg, chart.marker, "data-mode");
    CHECK(found.size() == chart.modes.size());  // exactly one curve (or bar) per mode
    CHECK(std::set<std::string>(found.begin(), found.end()) == chart.modes);
  }
  // Every curve is drawn: a path with at least one segment per logged step.
  for (const std::string& d : attribute_values(read_file(ws.dir / "report/loss.svg"), "class=\"curve\"", "d"))
    CHECK(count_of(d, "L") >= 5);
  // The validation curves: one per mode.
  CHECK(attribute_values(read_file(ws.dir / "report/loss.svg"), "class=\"val-curve\"", "data-mode").size() == 3);
  // The HTML report carries the charts inline and no external resource.
  const std::string html = read_file(ws.dir / "report/report.html");
  CHECK(count_of(html, "<svg") == 4);
  CHECK(html.find("src=\"http") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);

  // A tolerance of 0: bf16 and fp8 differ from fp32, so they regressed; exit 3 only when asked.
  const CommandResult strict = run_ptrain("compare" + dirs + " --out strict --tolerance 0", ws.dir);
  CHECK(strict.exit_code == 0);
  const std::string strict_md = read_file(ws.dir / "strict/report.md");
  CHECK(strict_md.find("Verdict: regressed beyond the tolerance: bf16, fp8:delayed.") != std::string::npos);
  CHECK(count_of(strict_md, "| regressed |") == 2);
  const CommandResult failing = run_ptrain("compare" + dirs + " --out strict --tolerance 0 --fail-on-regression", ws.dir);
  INFO(failing.output);
  CHECK(failing.exit_code == 3);
  const CommandResult loose = run_ptrain("compare" + dirs + " --out loose --tolerance 50 --fail-on-regression", ws.dir);
  CHECK(loose.exit_code == 0);
  // Another reference: the rows are measured against bf16.
  const CommandResult by_bf16 = run_ptrain("compare" + dirs + " --out by-bf16 --reference bf16", ws.dir);
  CHECK(by_bf16.exit_code == 0);
  CHECK(read_file(ws.dir / "by-bf16/report.md").find("# ptrain compare: bf16 vs fp32, fp8:delayed") != std::string::npos);
}

TEST_CASE("compare refuses runs that differ in more than precision, and bad modes", "[compare]") {
  TempDir ws("compare");
  write_file(ws.dir / "a.yaml", tiny_config("a"));
  write_file(ws.dir / "b.yaml", tiny_config("b", "{mode: bf16}", 32));
  for (const char* name : {"a", "b"}) REQUIRE(run_ptrain(std::string("train ") + name + ".yaml", ws.dir).exit_code == 0);
  const CommandResult r = run_ptrain("compare runs/a runs/b --out report", ws.dir);
  INFO(r.output);
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("model.n_embd: 64 in runs/a, 32 in runs/b") != std::string::npos);
  CHECK(!fs::exists(ws.dir / "report"));

  // The same shape in the other architecture: the key named is model.arch.
  REQUIRE(run_ptrain("train a.yaml --set run.name=llama --set model.arch=llama --set model.n_kv_head=2", ws.dir)
              .exit_code == 0);
  const CommandResult arch = run_ptrain("compare runs/a runs/llama --out report", ws.dir);
  INFO(arch.output);
  CHECK(arch.exit_code == 2);
  CHECK(arch.output.find("model.arch: \"gpt2\" in runs/a, \"llama\" in runs/llama") != std::string::npos);
  CHECK(!fs::exists(ws.dir / "report"));

  const CommandResult unfinished = run_ptrain("compare runs/a runs/missing", ws.dir);
  CHECK(unfinished.exit_code == 2);
  CHECK(unfinished.output.find("runs/missing") != std::string::npos);

  const CommandResult bad_mode = run_ptrain("compare a.yaml --modes fp32,int4", ws.dir);
  CHECK(bad_mode.exit_code == 2);
  CHECK(bad_mode.output.find("mode \"int4\" cannot run this config") != std::string::npos);
  CHECK(bad_mode.output.find("precision.mode: int4 is not a valid choice") != std::string::npos);
  // A mode's own constraints apply: the block recipe needs n_embd a multiple of 128.
  const CommandResult block = run_ptrain("compare a.yaml --modes fp32,fp8:block", ws.dir);
  INFO(block.output);
  CHECK(block.exit_code == 2);
  CHECK(block.output.find("mode \"fp8:block\" cannot run this config") != std::string::npos);
}

}  // namespace
}  // namespace ptrain::test
