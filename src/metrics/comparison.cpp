#include "metrics/comparison.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "config/config.h"
#include "core/error.h"
#include "core/format.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/paths.h"
#include "metrics/run_log.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

// The keys that must agree for two runs to be compared: everything that shapes the model, the
// data and the optimisation, but not the precision, the run's name or where it lives.
nlohmann::json comparable_keys(const Config& c) {
  nlohmann::json j = {
      {"model.n_layer", c.model.n_layer},
      {"model.n_head", c.model.n_head},
      {"model.n_embd", c.model.n_embd},
      {"model.seq_len", c.model.seq_len},
      {"model.vocab_size", c.model.vocab_size},
      {"model.init_from", c.model.init_from},
      {"model.init_std", c.model.init_std},
      {"run.seed", c.run.seed},
      {"training.steps", c.training.steps},
      {"training.batch_tokens", c.training.batch_tokens},
      {"training.micro_batch", c.training.micro_batch},
      {"training.seq_len", c.training.effective_seq_len(c.model)},
      {"training.grad_clip", c.training.grad_clip},
      {"training.loss_weight", c.training.loss_weight},
      {"training.eval_every", c.training.eval_every},
      {"training.eval_batches", c.training.eval_batches},
      {"optimizer.lr", c.optimizer.lr},
      {"optimizer.beta1", c.optimizer.beta1},
      {"optimizer.beta2", c.optimizer.beta2},
      {"optimizer.eps", c.optimizer.eps},
      {"optimizer.weight_decay", c.optimizer.weight_decay},
      {"schedule.warmup_steps", c.schedule.warmup_steps},
      {"schedule.decay", c.schedule.decay},
      {"schedule.min_lr_ratio", c.schedule.min_lr_ratio},
      {"schedule.wsd_decay_fraction", c.schedule.wsd_decay_fraction},
      {"model.arch", c.model.arch},
  };
  if (c.model.arch == Arch::llama) {  // resolved, as the model has them
    j["model.n_kv_head"] = c.model.kv_heads();
    j["model.mlp_hidden"] = c.model.swiglu_hidden();
    j["model.rope_theta"] = c.model.rope_theta;
    j["model.norm_eps"] = c.model.norm_eps;
    j["model.tie_embeddings"] = c.model.tie_embeddings == TieEmbeddings::yes;
    j["model.qk_norm"] = c.model.qk_norm;
  }
  if (c.data.synthetic_enabled) {
    const SyntheticDataConfig& s = c.data.synthetic;
    j["data.synthetic.vocab"] = s.vocab;
    j["data.synthetic.order"] = s.order;
    j["data.synthetic.branching"] = s.branching;
    j["data.synthetic.tokens"] = s.tokens;
    j["data.synthetic.seed"] = s.seed;
    j["data.synthetic.val_fraction"] = s.val_fraction;
  } else {
    if (c.data.sources.empty()) {
      j["data.train"] = c.data.train;
    } else {
      // One text, so that runs of other shares or globs differ in it (weights 7 and 3 are 0.7 and 0.3).
      double total = 0;
      for (const DataSource& source : c.data.sources) total += source.weight;
      std::string blend;
      for (const DataSource& source : c.data.sources)
        blend += (blend.empty() ? "" : " + ") + source.train + " x " + format_number("%.10g", source.weight / total);
      j["data.sources"] = blend;
    }
    j["data.val"] = c.data.val;
  }
  return j;
}

nlohmann::json read_json(const fs::path& path, const std::string& run) {
  if (path_kind(path.string(), "run \"" + run + "\"") == PathKind::missing)
    throw UserError("run \"" + run + "\": no " + path.filename().string() + " (not a finished ptrain run?)");
  return parse_json(InputFile(path.string(), "\"" + path.string() + "\"").read_all(64 << 20),
                    "run \"" + run + "\": " + path.filename().string());
}

std::optional<double> number_or_none(const nlohmann::json& j, const char* key) {
  if (j.contains(key) && j[key].is_number()) return j[key].get<double>();
  return std::nullopt;
}

void take_max(std::optional<double>& worst, double value) {
  if (!worst || value > *worst) worst = value;
}

double percent(double diff, double reference) { return reference != 0 ? 100.0 * diff / std::fabs(reference) : 0.0; }

}  // namespace

bool Comparison::any_regressed() const {
  return std::any_of(results.begin(), results.end(), [](const ModeResult& r) { return !r.within_tolerance; });
}

static RunRecord read_run_files(const std::string& dir);

RunRecord read_run(const std::string& dir) {
  // The files come from wherever the user points: a field of the wrong type is their problem.
  try {
    return read_run_files(dir);
  } catch (const nlohmann::json::exception& e) {
    throw UserError("run \"" + dir + "\": summary.json or metrics.jsonl holds a field of the wrong type (" + e.what() +
                    "); expected the files a ptrain run writes");
  }
}

static RunRecord read_run_files(const std::string& dir) {
  const fs::path path(dir);
  if (!fs::is_directory(path)) throw UserError("run \"" + dir + "\": not a directory");
  RunRecord r;
  r.dir = dir;
  if (!fs::exists(path / "config.yaml")) throw UserError("run \"" + dir + "\": no config.yaml (not a ptrain run directory?)");
  const Config config = load_config((path / "config.yaml").string());
  r.config = comparable_keys(config);
  r.batch_tokens = config.training.batch_tokens;

  const nlohmann::json summary = read_json(path / "summary.json", dir);
  // The precision label the run resolved for itself (its schedule's phases, if any).
  if (!summary.contains("precision") || !summary["precision"].is_string())
    throw UserError("run \"" + dir + "\": summary.json has no precision label; expected the files a ptrain run writes");
  r.mode = summary["precision"].get<std::string>();
  // Runs from before summary.json recorded it trained on one rank as far as compare knows.
  const nlohmann::json ranks = summary.value("ranks", nlohmann::json(1));
  if (!ranks.is_number_integer() || ranks.get<int64_t>() < 1 || ranks.get<int64_t>() > 65536)
    throw UserError("run \"" + dir + "\": summary.json's ranks is " + ranks.dump() +
                    "; expected a whole number from 1 to 65536");
  r.ranks = ranks.get<int>();
  r.peak_memory_mib = summary.value("peak_memory_mib", 0.0);
  const double device = summary.value("peak_device_memory_mib", 0.0);
  if (device > 0) r.peak_device_memory_mib = device;
  r.skipped_steps = summary.value("skipped_steps", int64_t{0});
  r.oracle_loss = number_or_none(summary, "oracle_loss");

  // A resumed run repeats the steps after its checkpoint: the last record of a step counts.
  struct StepRecord {
    double loss, tokens_per_s, seconds;
  };
  std::map<int64_t, StepRecord> steps;
  std::map<int64_t, double> vals;
  if (path_kind((path / "metrics.jsonl").string(), "run \"" + dir + "\"") == PathKind::missing)
    throw UserError("run \"" + dir + "\": no metrics.jsonl");
  std::istringstream in(InputFile((path / "metrics.jsonl").string(), "\"" + (path / "metrics.jsonl").string() + "\"")
                            .read_all(int64_t{1} << 32));
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    const nlohmann::json m = parse_json(line, "run \"" + dir + "\": metrics.jsonl line " + std::to_string(line_no));
    if (!m.contains("step")) continue;
    const int64_t step = m["step"].get<int64_t>();
    if (m.contains("loss") && m.contains("tokens_per_s")) {
      const double tokens_per_s = m["tokens_per_s"].get<double>();
      // "ms" is the step's own time; tokens_per_s is batch_tokens over it, for a record without.
      const double seconds = m.contains("ms") ? m["ms"].get<double>() / 1000.0
                                              : static_cast<double>(r.batch_tokens) / tokens_per_s;
      steps[step] = {m["loss"].get<double>(), tokens_per_s, seconds};
    }
    if (m.contains("val_loss")) vals[step] = m["val_loss"].get<double>();
    if (m.contains("numerics") && m["numerics"].contains("fp8"))
      for (const auto& t : m["numerics"]["fp8"]) {
        take_max(r.fp8_underflow, t.value("underflow", 0.0));
        take_max(r.fp8_saturation, t.value("saturated", 0.0));
      }
  }
  if (steps.empty()) throw UserError("run \"" + dir + "\": metrics.jsonl holds no training steps");
  for (const auto& [step, v] : steps) {
    r.steps.push_back(step);
    r.loss.push_back(v.loss);
    r.tokens_per_s.push_back(v.tokens_per_s);
    r.step_seconds.push_back(v.seconds);
  }
  for (const auto& [step, v] : vals) {
    r.val_steps.push_back(step);
    r.val_loss.push_back(v);
  }
  return r;
}

std::vector<std::string> run_mismatches(const RunRecord& a, const RunRecord& b) {
  // Both come from comparable_keys: a key only b has (shards against synthetic data) comes with
  // one only a has, which is named.
  std::vector<std::string> out;
  for (const auto& [key, value] : a.config.items()) {
    const nlohmann::json other = b.config.value(key, nlohmann::json());
    if (other != value)
      out.push_back(key + ": " + value.dump() + " in " + a.dir + ", " + (other.is_null() ? "absent" : other.dump()) +
                    " in " + b.dir);
  }
  return out;
}

std::optional<double> first_step_reaching(const std::vector<int64_t>& steps, const std::vector<double>& loss,
                                          double target) {
  for (size_t i = 0; i < steps.size(); ++i) {
    if (!(loss[i] <= target)) continue;  // NaN never reaches
    if (i == 0 || !std::isfinite(loss[i - 1])) return static_cast<double>(steps[i]);
    const double fraction = (loss[i - 1] - target) / (loss[i - 1] - loss[i]);  // in (0, 1]: loss[i-1] > target
    return static_cast<double>(steps[i - 1]) + fraction * static_cast<double>(steps[i] - steps[i - 1]);
  }
  return std::nullopt;
}

double training_seconds_at(const std::vector<int64_t>& steps, const std::vector<double>& step_seconds, double step) {
  double total = 0;
  for (size_t i = 0; i < steps.size(); ++i) {
    const double s = static_cast<double>(steps[i]);
    if (s <= step)
      total += step_seconds[i];
    else if (s - 1 < step)  // the step in progress
      total += (step - (s - 1)) * step_seconds[i];
  }
  return total;
}

Comparison compare_runs(std::vector<RunRecord> runs, const std::string& reference, double tolerance_pct,
                        std::optional<double> target_loss) {
  if (runs.size() < 2) throw UserError("compare: needs at least two runs, got " + std::to_string(runs.size()));
  const auto ref_it =
      std::find_if(runs.begin(), runs.end(), [&](const RunRecord& r) { return r.mode == reference; });
  if (ref_it == runs.end()) {
    std::string modes;
    for (const RunRecord& r : runs) modes += (modes.empty() ? "" : ", ") + r.mode;
    throw UserError("compare: --reference " + reference + " is none of the runs' modes (" + modes + ")");
  }
  std::rotate(runs.begin(), ref_it, ref_it + 1);  // the reference first, the others in their order
  std::vector<std::string> problems;
  for (size_t i = 1; i < runs.size(); ++i) {
    for (size_t j = 0; j < i; ++j)
      if (runs[j].mode == runs[i].mode)
        problems.push_back("compare: " + runs[j].dir + " and " + runs[i].dir + " are both " + runs[i].mode +
                           ": one run per mode");
    for (const std::string& m : run_mismatches(runs[0], runs[i]))
      problems.push_back("compare: the runs differ in more than precision: " + m);
  }
  if (!problems.empty()) throw UserErrors(problems);

  Comparison c;
  c.reference = reference;
  c.tolerance_pct = tolerance_pct;
  const RunRecord& ref = runs[0];
  c.int8_evaluated = std::any_of(runs.begin(), runs.end(), [](const RunRecord& r) { return r.int8_val_loss.has_value(); });
  c.target_given = target_loss.has_value();
  c.target_loss = target_loss;
  if (!c.target_loss && !ref.val_loss.empty() && std::isfinite(ref.val_loss.back())) c.target_loss = ref.val_loss.back();
  std::map<int64_t, double> ref_loss;
  for (size_t i = 0; i < ref.steps.size(); ++i) ref_loss[ref.steps[i]] = ref.loss[i];
  const double ref_speed = median_after_first(ref.tokens_per_s);
  for (const RunRecord& r : runs) {
    ModeResult m;
    m.mode = r.mode;
    m.final_loss = r.loss.back();
    m.loss_diff = m.final_loss - ref.loss.back();
    m.loss_diff_pct = percent(m.loss_diff, ref.loss.back());
    if (!r.val_loss.empty()) {
      m.final_val_loss = r.val_loss.back();
      if (!ref.val_loss.empty()) {
        m.val_diff = *m.final_val_loss - ref.val_loss.back();
        m.val_diff_pct = percent(*m.val_diff, ref.val_loss.back());
      }
      if (r.oracle_loss) m.oracle_gap = *m.final_val_loss - *r.oracle_loss;
    }
    for (size_t i = 0; i < r.steps.size(); ++i) {
      const auto it = ref_loss.find(r.steps[i]);
      if (it == ref_loss.end()) continue;
      const double d = std::fabs(r.loss[i] - it->second);
      if (d > m.max_divergence || std::isnan(d)) {  // the first NaN is where the curves part for good
        m.max_divergence = d;
        m.max_divergence_step = r.steps[i];
        if (std::isnan(d)) break;
      }
    }
    m.tokens_per_s = median_after_first(r.tokens_per_s);
    m.speedup = ref_speed > 0 ? m.tokens_per_s / ref_speed : 0;
    m.device_memory = r.peak_device_memory_mib.has_value();
    m.peak_memory_mib = m.device_memory ? *r.peak_device_memory_mib : r.peak_memory_mib;
    m.gpu_plan_mib = r.gpu_plan_mib;
    m.gpu_plan_state_bytes_per_param = r.gpu_plan_state_bytes_per_param;
    m.skipped_steps = r.skipped_steps;
    m.fp8_underflow = r.fp8_underflow;
    m.fp8_saturation = r.fp8_saturation;
    for (const double s : r.step_seconds) m.train_seconds += s;
    if (c.target_loss) {
      m.target_step = first_step_reaching(r.val_steps, r.val_loss, *c.target_loss);
      if (m.target_step) {
        m.time_to_target_s = training_seconds_at(r.steps, r.step_seconds, *m.target_step);
        m.tokens_to_target = *m.target_step * static_cast<double>(r.batch_tokens);
      }
    }
    if (r.int8_val_loss && r.final_checkpoint_val_loss)
      m.int8_diff_pct = percent(*r.int8_val_loss - *r.final_checkpoint_val_loss, *r.final_checkpoint_val_loss);
    const double judged = m.val_diff_pct ? *m.val_diff_pct : m.loss_diff_pct;
    m.within_tolerance = &r == &runs[0] || std::fabs(judged) <= tolerance_pct;  // NaN: regressed
    c.results.push_back(m);
  }
  const std::optional<double> ref_time = c.results.front().time_to_target_s;
  for (ModeResult& m : c.results)
    if (ref_time && *ref_time > 0 && m.time_to_target_s && *m.time_to_target_s > 0) m.target_speedup = *ref_time / *m.time_to_target_s;
  c.runs = std::move(runs);
  return c;
}

}  // namespace ptrain
