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

#include "metrics/comparison.h"
#include "metrics/report.h"
#include "metrics/svg_chart.h"
#include "core/format.h"
#include "train/compare_command.h"
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
  for (const char* f :
       {"report.md", "report.html", "loss.svg", "loss_time.svg", "loss_diff.svg", "throughput.svg", "memory.svg"})
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

  // The Markdown tables show those numbers, on the bf16 rows (quality, then speed and memory).
  const std::string md = read_file(ws.dir / "out/report.md");
  std::string bf16_row;
  for (size_t row = md.find("| bf16"); row != std::string::npos; row = md.find("| bf16", row + 1))
    bf16_row += md.substr(row, md.find('\n', row) - row);
  REQUIRE(count_of(bf16_row, "| bf16") == 2);
  INFO(bf16_row);
  CHECK(bf16_row.find(format_number("%.4f", b.loss.at(6))) != std::string::npos);
  CHECK(bf16_row.find(format_number("%+.4f", loss_diff)) != std::string::npos);
  CHECK(bf16_row.find(format_number("%+.2f%%", val_diff_pct)) != std::string::npos);
  CHECK(bf16_row.find(format_number("%.2fx", speedup)) != std::string::npos);
  CHECK(bf16_row.find(format_number("(step %.0f)", static_cast<double>(divergence_step))) != std::string::npos);

  // Each mode's GPU memory is the plan `ptrain train --dry-run` prints for its run on a GPU,
  // beside the host's measured peak, and the verdict names it.
  CHECK(md.find("| peak host memory MiB | GPU plan MiB per rank | GPU plan B/param without activations |") !=
        std::string::npos);
  for (const auto& [mode, dir] : {std::pair{"fp32", fp32_dir}, std::pair{"bf16", bf16_dir}}) {
    const CommandResult dry =
        run_ptrain("train " + (dir / "config.yaml").string() + " --dry-run --set run.device=cuda", ws.dir);
    INFO(dry.output);
    REQUIRE(dry.exit_code == 0);
    const size_t plan = dry.output.find("GPU memory plan per rank: ");
    REQUIRE(plan != std::string::npos);
    const std::string mib = dry.output.substr(plan + 26, dry.output.find(" MiB", plan) - plan - 26);
    const size_t state_end = dry.output.find(" without activations", plan);
    const std::string state = dry.output.substr(dry.output.rfind(' ', state_end - 1) + 1,
                                                state_end - dry.output.rfind(' ', state_end - 1) - 1);
    const size_t speed_row = md.find(std::string("| ") + mode + " |", md.find("## Speed and memory"));
    const std::string row = md.substr(speed_row, md.find('\n', speed_row) - speed_row);
    INFO(row);
    CHECK(row.find("| " + mib + " | " + state + " |") != std::string::npos);
  }
  CHECK(md.find("its GPU memory plan is ") != std::string::npos);

  // A second compare replaces the report only with --force, and then finds both runs finished
  // and trains nothing.
  const CommandResult refused = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out", ws.dir);
  CHECK(refused.exit_code == 2);
  CHECK_THAT(refused.output, Catch::Contains("--out \"out\" exists and is not empty") && Catch::Contains("--force"));
  CHECK(read_file(ws.dir / "out/report.md") == md);
  const CommandResult again = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out --force", ws.dir);
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
  for (const Chart& chart :
       {Chart{"loss.svg", "class=\"curve\"", all}, Chart{"loss.svg", "class=\"raw-curve\"", all},
        Chart{"loss_time.svg", "class=\"curve\"", all}, Chart{"loss_time.svg", "class=\"raw-curve\"", all},
        Chart{"loss_diff.svg", "class=\"curve\"", others}, Chart{"loss_diff.svg", "class=\"raw-curve\"", others},
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
  CHECK(count_of(html, "<svg") == 5);
  CHECK(html.find("src=\"http") == std::string::npos);
  CHECK(html.find("<script") == std::string::npos);

  // A tolerance of 0: bf16 and fp8 differ from fp32, so they regressed; exit 3 only when asked.
  const CommandResult strict = run_ptrain("compare" + dirs + " --out strict --tolerance 0", ws.dir);
  CHECK(strict.exit_code == 0);
  const std::string strict_md = read_file(ws.dir / "strict/report.md");
  CHECK(strict_md.find("Regressed beyond the 0% tolerance: bf16, fp8:delayed.") != std::string::npos);
  CHECK(count_of(strict_md, "| regressed |") == 2);
  const CommandResult failing = run_ptrain("compare" + dirs + " --out strict --tolerance 0 --fail-on-regression --force", ws.dir);
  INFO(failing.output);
  CHECK(failing.exit_code == 3);
  const CommandResult loose = run_ptrain("compare" + dirs + " --out loose --tolerance 50 --fail-on-regression", ws.dir);
  CHECK(loose.exit_code == 0);
  // Another reference: the rows are measured against bf16.
  const CommandResult by_bf16 = run_ptrain("compare" + dirs + " --out by-bf16 --reference bf16", ws.dir);
  CHECK(by_bf16.exit_code == 0);
  CHECK(read_file(ws.dir / "by-bf16/report.md").find("# ptrain compare: bf16 vs fp32, fp8:delayed") != std::string::npos);
}

TEST_CASE("time to target: the first crossing, interpolated between evaluations, and the training time to it",
          "[compare]") {
  const std::vector<int64_t> evals = {0, 5, 10, 15};
  const std::vector<double> val = {4.0, 3.0, 2.0, 1.5};
  CHECK(*first_step_reaching(evals, val, 4.5) == 0);    // the first evaluation already is below
  CHECK(*first_step_reaching(evals, val, 2.5) == 7.5);  // halfway from 3.0 at step 5 to 2.0 at step 10
  CHECK(*first_step_reaching(evals, val, 2.0) == 10);   // reaching means at or below
  CHECK(*first_step_reaching(evals, val, 1.75) == 12.5);
  CHECK(!first_step_reaching(evals, val, 1.0));
  // The first crossing counts, not a later one; a non-finite loss never reaches.
  CHECK(*first_step_reaching({0, 5, 10, 15}, {4.0, 2.0, 3.0, 1.0}, 2.5) == 3.75);
  CHECK(*first_step_reaching({0, 5, 10}, {4.0, NAN, 2.0}, 3.0) == 10);
  CHECK(!first_step_reaching({0, 5}, {NAN, INFINITY}, 3.0));

  const std::vector<int64_t> steps = {1, 2, 3};
  const std::vector<double> seconds = {1.0, 2.0, 4.0};
  CHECK(training_seconds_at(steps, seconds, 0) == 0);
  CHECK(training_seconds_at(steps, seconds, 1.5) == 2.0);  // step 1, and half of step 2
  CHECK(training_seconds_at(steps, seconds, 2) == 3.0);
  CHECK(training_seconds_at(steps, seconds, 2.5) == 5.0);
  CHECK(training_seconds_at(steps, seconds, 3) == 7.0);
}

// A run made up in the test: `n` steps of `step_s` seconds, evaluations every 10 steps.
RunRecord made_up_run(const std::string& mode, const std::vector<double>& val, double step_s, double memory_mib) {
  RunRecord r;
  r.dir = "runs/" + mode;
  r.mode = mode;
  r.config = {{"training.eval_every", 10}};
  r.batch_tokens = 1000;
  for (int64_t s = 1; s <= 10 * static_cast<int64_t>(val.size() - 1); ++s) {
    r.steps.push_back(s);
    r.loss.push_back(5.0 - 0.01 * static_cast<double>(s));
    r.tokens_per_s.push_back(1000 / step_s);
    r.step_seconds.push_back(step_s);
  }
  for (size_t i = 0; i < val.size(); ++i) r.val_steps.push_back(static_cast<int64_t>(10 * i));
  r.val_loss = val;
  r.peak_memory_mib = memory_mib;
  return r;
}

TEST_CASE("compare's verdict paragraph states time to target, final val loss, memory and throughput in words",
          "[compare]") {
  // fp32 reaches its final val loss 2.0 at step 30 (30 s). fp8 crosses it at step 25 (12.5 s,
  // 0.5 s a step): 2.40x sooner, though its final val loss ends 0.5% higher. bf16 never gets there.
  const Comparison c = compare_runs({made_up_run("fp32", {4.0, 3.0, 2.5, 2.0}, 1.0, 1000),
                                     made_up_run("fp8:current", {4.0, 3.0, 2.4, 1.6, 2.01}, 0.5, 800),
                                     made_up_run("bf16", {4.0, 3.0, 2.5, 2.1}, 1.0, 1100)},
                                    "fp32", 2.0);
  REQUIRE(c.target_loss == 2.0);
  const ModeResult& fp8 = c.results[1];
  CHECK(*fp8.target_step == 25);
  CHECK(*fp8.time_to_target_s == 12.5);
  CHECK(*fp8.tokens_to_target == 25000);
  CHECK(*fp8.target_speedup == 30.0 / 12.5);
  CHECK(fp8.train_seconds == 20.0);
  CHECK(!c.results[2].time_to_target_s);
  const std::string v = verdict_paragraph(c);
  INFO(v);
  CHECK(v ==
        "fp8:current reached fp32's final val loss (2.0000) 2.40x sooner than fp32 (12.5 s of training against 30.0 s); "
        "its final val loss is 0.50% higher; measured host resident memory 20% lower; throughput 2.00x fp32's. "
        "bf16 never reached fp32's final val loss (2.0000) in its 30 steps (its lowest val loss: 2.1000); "
        "its final val loss is 5.00% higher; measured host resident memory 10% higher; throughput 1.00x fp32's. "
        "Regressed beyond the 2% tolerance: bf16. Times to target are interpolated between evaluations, every 10 steps.");
  // The report leads with it, and the table says "never" for bf16.
  const std::string md = report_markdown(c);
  CHECK(md.find("**Verdict.** fp8:current reached") < md.find("Config:"));
  CHECK(md.find("| bf16 | 30.0 s | never | never | — |") != std::string::npos);
  CHECK(md.find("| fp8:current | 20.0 s | 12.5 s | 25,000 | 2.40x |") != std::string::npos);

  // A target of one's own: fp32 never reaches 1.8, fp8 does (at step 27.5, 13.75 s).
  const Comparison own = compare_runs({made_up_run("fp32", {4.0, 3.0, 2.5, 2.0}, 1.0, 1000),
                                       made_up_run("fp8:current", {4.0, 3.0, 2.4, 1.6, 2.01}, 0.5, 800)},
                                      "fp32", 2.0, 1.8);
  CHECK(*own.results[1].time_to_target_s == 13.75);
  CHECK(verdict_paragraph(own).find("fp8:current reached the target val loss 1.8000 after 13.8 s of training, where "
                                    "fp32 never did") == 0);
  // Given each mode's GPU plan, the verdict names what the mode saves on a GPU.
  RunRecord planned_fp32 = made_up_run("fp32", {4.0, 3.0, 2.5, 2.0}, 1.0, 1000),
            planned_bf16 = made_up_run("bf16", {4.0, 3.0, 2.5, 2.0}, 1.0, 1000);
  planned_fp32.gpu_plan_mib = 400;
  planned_fp32.gpu_plan_state_bytes_per_param = 16;
  planned_bf16.gpu_plan_mib = 300;
  planned_bf16.gpu_plan_state_bytes_per_param = 18;
  CHECK_THAT(verdict_paragraph(compare_runs({planned_fp32, planned_bf16}, "fp32", 2.0)),
             Catch::Contains("; its GPU memory plan is 25% lower (300.0 MiB per rank against 400.0; 18.00 bytes per "
                             "parameter against 16.00 without activations); measured host resident memory the same;"));
  // The time chart marks the target and where each mode reached it.
  const std::string chart = loss_time_chart_svg(c);
  CHECK(count_of(chart, "class=\"target\"") == 1);
  CHECK(attribute_values(chart, "class=\"target-point\"", "data-mode") == std::vector<std::string>{"fp32", "fp8:current"});
}

TEST_CASE("the charts' smoothing is the debiased EMA its definition gives", "[compare]") {
  const std::vector<double> s = ema_smoothed({1.0, 2.0, 3.0, NAN, 5.0, 7.0}, 0.5);
  CHECK(s[0] == 1.0);  // starts at the first value
  CHECK(s[1] == Approx((0.25 * 1 + 0.5 * 2) / 0.75).epsilon(1e-15));
  CHECK(s[2] == Approx((0.125 * 1 + 0.25 * 2 + 0.5 * 3) / 0.875).epsilon(1e-15));
  CHECK(std::isnan(s[3]));  // a gap, after which the average starts again
  CHECK(s[4] == 5.0);
  CHECK(s[5] == Approx((0.25 * 5 + 0.5 * 7) / 0.75).epsilon(1e-15));
}

TEST_CASE("compare --target-loss: a target never reached is shown as such, a bad one refused", "[compare]") {
  TempDir ws("compare");
  write_file(ws.dir / "tiny.yaml", tiny_config("tiny"));
  // 0.5 is below the synthetic corpus's oracle loss (about 1.08): no model reaches it.
  const CommandResult r = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out --target-loss 0.5", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string md = read_file(ws.dir / "out/report.md");
  CHECK(md.find("fp32 never did") == std::string::npos);
  CHECK(md.find("bf16 never reached the target val loss 0.5000 in its 6 steps") != std::string::npos);
  CHECK(count_of(md, "| never | never | — |") == 2);
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    INFO(bad);
    const CommandResult refused =
        run_ptrain(std::string("compare tiny.yaml --modes fp32,bf16 --out refused --target-loss ") + bad, ws.dir);
    CHECK(refused.exit_code == 2);
    CHECK(refused.output.find("--target-loss") != std::string::npos);
    CHECK(!fs::exists(ws.dir / "refused"));
  }
}

TEST_CASE("compare --int8-eval: each run's final checkpoint with INT8 weights, as eval --weights int8 gives it",
          "[compare][int8]") {
  TempDir ws("compare");
  write_file(ws.dir / "tiny.yaml", tiny_config("tiny"));
  // The tiny config keeps no final checkpoint: refused before anything is trained or written.
  const CommandResult refused = run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out --int8-eval", ws.dir);
  INFO(refused.output);
  CHECK(refused.exit_code == 2);
  CHECK(refused.output.find("--int8-eval: checkpoint.save_final is false") != std::string::npos);
  CHECK(!fs::exists(ws.dir / "out"));

  const CommandResult r =
      run_ptrain("compare tiny.yaml --modes fp32,bf16 --out out --int8-eval --set checkpoint.save_final=true", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const std::string md = read_file(ws.dir / "out/report.md");
  CHECK(md.find("| INT8 weights val Δ% |") != std::string::npos);
  for (const char* mode : {"fp32", "bf16"}) {
    INFO(mode);
    const std::string dir = std::string("out/runs/tiny-") + mode;
    const CommandResult eval =
        run_ptrain("eval " + dir + "/config.yaml --checkpoint " + dir + "/checkpoints/step_00000006 --weights int8", ws.dir);
    INFO(eval.output);
    REQUIRE(eval.exit_code == 0);
    const size_t at = eval.output.find("against the fp32 masters");
    REQUIRE(at != std::string::npos);
    // "(+0.123%)" just before it: the same figure the report's row and verdict carry.
    const size_t open = eval.output.rfind('(', at);
    const std::string pct = eval.output.substr(open + 1, eval.output.find(')', open) - open - 1);
    const size_t row = md.find(std::string("| ") + mode + " |");
    REQUIRE(row != std::string::npos);
    CHECK(md.substr(row, md.find('\n', row) - row).find("| " + pct + " |") != std::string::npos);
    CHECK(md.find(pct + " (" + mode + ")") != std::string::npos);
  }
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

  // A summary.json whose ranks are not a rank count (the GPU plan is per rank), or do not share
  // the batch, is named.
  REQUIRE(run_ptrain("train a.yaml --set run.name=c", ws.dir).exit_code == 0);
  const std::string summary = read_file(ws.dir / "runs/c/summary.json");
  for (const auto& [ranks, expected] : std::vector<std::pair<std::string, std::string>>{
           {"2.5", "summary.json's ranks is 2.5; expected a whole number from 1 to 65536"},
           {"0", "summary.json's ranks is 0; expected a whole number from 1 to 65536"},
           {"3", "not a whole number of micro-batches on its 3 ranks"}}) {
    nlohmann::json edited = nlohmann::json::parse(summary);
    edited["ranks"] = nlohmann::json::parse(ranks);
    write_file(ws.dir / "runs/c/summary.json", edited.dump());
    const CommandResult bad = run_ptrain("compare runs/a runs/c --out report", ws.dir);
    INFO(bad.output);
    CHECK(bad.exit_code == 2);
    CHECK(bad.output.find("run \"runs/c\"") != std::string::npos);
    CHECK(bad.output.find(expected) != std::string::npos);
    CHECK(!fs::exists(ws.dir / "report"));
  }

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
  // "schedule" is the config's own, which a.yaml lacks; a named one must exist.
  const CommandResult own = run_ptrain("compare a.yaml --modes fp32,schedule", ws.dir);
  CHECK(own.exit_code == 2);
  CHECK(own.output.find("\"schedule\": the config has no precision.schedule; expected one, or a named schedule: "
                        "schedule:fp8-then-bf16, schedule:bf16-then-fp8") != std::string::npos);
  const CommandResult unnamed = run_ptrain("compare a.yaml --modes fp32,schedule:fast", ws.dir);
  CHECK(unnamed.exit_code == 2);
  CHECK(unnamed.output.find("\"schedule:fast\" is not a named schedule") != std::string::npos);
}

// Primary FP8 weights are part of a mode: fp8:RECIPE+primary has them, fp8:RECIPE not, a bare
// fp8 as the config says (as it takes the config's recipe); the modes that run blocks in bf16
// keep their bf16 weights whatever the config says. The run's name and label say which.
TEST_CASE("compare's modes with and without primary FP8 weights, from configs with and without them", "[compare]") {
  CompareOptions options;
  options.out_dir = "out";
  for (const bool configured : {false, true}) {
    CAPTURE(configured);
    const Config base = parse_config(
        tiny_config("tiny", configured ? "{mode: fp8, fp8: {primary_weights: true}}" : "{mode: fp8}", 128), "tiny.yaml");
    for (const auto& [mode, primary] : std::vector<std::pair<std::string, bool>>{{"fp32", false},
                                                                                 {"bf16", false},
                                                                                 {"fp8", configured},
                                                                                 {"fp8+primary", true},
                                                                                 {"fp8:block", false},
                                                                                 {"fp8:block+primary", true},
                                                                                 {"schedule:fp8-then-bf16", false}}) {
      CAPTURE(mode);
      const Config c = config_for_mode(base, mode, options);
      CHECK(c.precision.fp8.primary_weights == primary);
      CHECK((c.run.name.find("-primary") != std::string::npos) == primary);
    }
    CHECK(config_for_mode(base, "fp8:current+primary", options).run.name == "tiny-fp8-current-primary");
    CHECK_THROWS_WITH(config_for_mode(base, "bf16+primary", options),
                      Catch::Contains("+primary (precision.fp8.primary_weights) goes with fp8 only"));
  }
}

// +codes (the MLP's input kept as FP8 codes) follows the same rules, alone or with +primary in
// either order; the run's name and label carry it, so the two runs of a mode do not collide.
TEST_CASE("compare's modes with and without the MLP's input as FP8 codes", "[compare]") {
  CompareOptions options;
  options.out_dir = "out";
  for (const bool configured : {false, true}) {
    CAPTURE(configured);
    const Config base = parse_config(
        tiny_config("tiny", configured ? "{mode: fp8, fp8: {mlp_input_codes: true}}" : "{mode: fp8}", 128), "tiny.yaml");
    for (const auto& [mode, codes] : std::vector<std::pair<std::string, bool>>{{"fp32", false},
                                                                               {"bf16", false},
                                                                               {"fp8", configured},
                                                                               {"fp8+codes", true},
                                                                               {"fp8:block", false},
                                                                               {"fp8:current+codes", true},
                                                                               {"schedule:fp8-then-bf16", false}}) {
      CAPTURE(mode);
      const Config c = config_for_mode(base, mode, options);
      CHECK(c.precision.fp8.mlp_input_codes == codes);
      CHECK((c.run.name.find("-codes") != std::string::npos) == codes);
    }
    for (const char* both : {"fp8:current+primary+codes", "fp8:current+codes+primary"}) {
      const Config c = config_for_mode(base, both, options);
      CHECK((c.precision.fp8.primary_weights && c.precision.fp8.mlp_input_codes));
      CHECK(c.run.name == "tiny-fp8-current-primary-codes");
    }
    CHECK_THROWS_WITH(config_for_mode(base, "bf16+codes", options),
                      Catch::Contains("+codes (precision.fp8.mlp_input_codes) goes with fp8 only"));
    for (const char* twice : {"fp8:current+codes+codes", "fp8:current+codes+primary+codes"})
      CHECK_THROWS_WITH(config_for_mode(base, twice, options), Catch::Contains("+codes is given twice"));
  }
}

TEST_CASE("compare takes precision schedules as modes: a preset and the config's own", "[compare]") {
  TempDir ws("compare");
  // The config's own schedule: bf16 for 2 steps, then fp8:current; its plain modes drop it.
  write_file(ws.dir / "tiny.yaml",
             tiny_config("tiny", "{schedule: [{until_step: 2, mode: bf16}, {mode: fp8, fp8: {recipe: current}}]}"));
  const CommandResult r =
      run_ptrain("compare tiny.yaml --modes fp32,schedule:fp8-then-bf16,schedule --out out", ws.dir);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  // fp8-then-bf16 is fp8:current for floor(0.9 x 6) = 5 steps, then bf16.
  for (const char* run : {"runs/tiny-fp32", "runs/tiny-fp8-current-bf16-5", "runs/tiny-bf16-fp8-current-2"})
    CHECK(fs::exists(ws.dir / "out" / run / "summary.json"));
  CHECK(read_json_file(ws.dir / "out/runs/tiny-fp32/summary.json")["precision"] == "fp32");
  const std::string html = read_file(ws.dir / "out/report.html");
  for (const char* label : {"fp8:current&gt;bf16@5", "bf16&gt;fp8:current@2"}) CHECK(html.find(label) != std::string::npos);
  const std::vector<nlohmann::json> switches =
      records_with(ws.dir / "out/runs/tiny-fp8-current-bf16-5/metrics.jsonl", "precision_phase");
  REQUIRE(switches.size() == 1);
  const nlohmann::json& phase = switches[0]["precision_phase"];
  CHECK(switches[0]["step"] == 6);
  CHECK(phase["from"] == "fp8:current");
  CHECK(phase["to"] == "bf16");
  CHECK(r.output.find("precision: step " + std::to_string(switches[0]["step"].get<int64_t>()) + " starts phase " +
                      std::to_string(phase["phase"].get<int64_t>()) + " of 2, " + phase["from"].get<std::string>() +
                      " -> " + phase["to"].get<std::string>()) != std::string::npos);
  // A schedule's label is too wide for the legend column: one line per phase.
  const std::string chart = read_file(ws.dir / "out/loss.svg");
  CHECK(chart.find(">fp8:current&gt;</text>") != std::string::npos);
  CHECK(chart.find(">bf16@5</text>") != std::string::npos);
}

// A mode with FP8 settings is too wide too: one line per setting.
TEST_CASE("the charts' legend breaks a long mode before each FP8 setting", "[compare]") {
  std::string svg;
  svg::draw_legend(svg, {{"fp8:current+primary+codes", "#000000"}, {"bf16", "#111111"}});
  for (const char* line : {">fp8:current</text>", ">+primary</text>", ">+codes</text>", ">bf16</text>"})
    CHECK(svg.find(line) != std::string::npos);
}

}  // namespace
}  // namespace ptrain::test
