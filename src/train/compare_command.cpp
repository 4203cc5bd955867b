#include "train/compare_command.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "core/format.h"
#include "core/paths.h"
#include "metrics/report.h"
#include "metrics/run_log.h"
#include "precision/policy.h"
#include "optim/divergence_guard.h"
#include "train/run_plan.h"
#include "train/run_spec.h"
#include "train/checkpoint_model.h"
#include "train/eval_command.h"
#include "train/gpu_memory_plan.h"
#include "train/output_policy.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

// The named precision schedules `--modes schedule:NAME` gives, as precision.schedule's YAML.
const std::vector<std::pair<std::string, std::string>> kSchedulePresets = {
    // FP8 for the bulk of training, BF16 for the cool-down (where the LR is small and FP8's
    // rounding is largest next to the updates).
    {"fp8-then-bf16", "[{until_fraction: 0.9, mode: fp8, fp8: {recipe: current}}, {mode: bf16}]"},
    // BF16 while the early loss falls fastest and activations change most, then FP8.
    {"bf16-then-fp8", "[{until_fraction: 0.1, mode: bf16}, {mode: fp8, fp8: {recipe: current}}]"},
};

std::string preset_names() {
  std::string names;
  for (const auto& [name, yaml] : kSchedulePresets) names += (names.empty() ? "schedule:" : ", schedule:") + name;
  return names;
}

// The overrides that put `base` in `mode`.
std::vector<std::string> mode_overrides(const Config& base, const std::string& mode_given) {
  // FP8 settings a mode may end with, in any order: +primary (primary FP8 weights) and +codes
  // (the MLP's input kept as FP8 codes). fp8:RECIPE without one runs without it; a bare fp8
  // keeps the config's setting, as it keeps its recipe. A mode that runs a block in bf16 (any
  // mode but fp8, a schedule) runs without them.
  struct Fp8Setting {
    const char* suffix;
    const char* key;
    bool configured;
    bool asked = false;
  };
  Fp8Setting settings[] = {{"+primary", "precision.fp8.primary_weights", base.precision.fp8.primary_weights},
                           {"+codes", "precision.fp8.mlp_input_codes", base.precision.fp8.mlp_input_codes}};
  std::string mode = mode_given;
  for (bool stripped = true; stripped;) {
    stripped = false;
    for (Fp8Setting& f : settings) {
      const std::string suffix = f.suffix;
      if (mode.size() > suffix.size() && mode.compare(mode.size() - suffix.size(), suffix.size(), suffix) == 0) {
        if (f.asked) throw UserError("--modes: \"" + mode_given + "\": " + suffix + " is given twice");
        mode.resize(mode.size() - suffix.size());
        f.asked = stripped = true;
      }
    }
  }
  const size_t colon = mode.find(':');
  const std::string name = mode.substr(0, colon);
  std::vector<std::string> overrides;
  for (const Fp8Setting& f : settings) {
    if (f.asked && name != "fp8")
      throw UserError("--modes: \"" + mode_given + "\": " + f.suffix + " (" + f.key + ") goes with fp8 only, e.g. fp8:current" +
                      f.suffix);
    if (f.asked)
      overrides.push_back(std::string(f.key) + "=true");
    else if (f.configured && (name != "fp8" || colon != std::string::npos))
      overrides.push_back(std::string(f.key) + "=false");
  }
  if (name == "schedule") {
    // precision.mode follows the schedule's first phase.
    if (colon == std::string::npos) {
      if (base.precision.schedule.empty())
        throw UserError("--modes: \"schedule\": the config has no precision.schedule; expected one, or a named "
                        "schedule: " + preset_names());
      return overrides;
    }
    for (const auto& [preset, yaml] : kSchedulePresets)
      if (mode.substr(colon + 1) == preset) {
        overrides.insert(overrides.end(), {"precision.mode=null", "precision.schedule=" + yaml});
        return overrides;
      }
    throw UserError("--modes: \"" + mode + "\" is not a named schedule; expected schedule (the config's own) or one of " +
                    preset_names());
  }
  overrides.insert(overrides.end(), {"precision.schedule=null", "precision.mode=" + name});
  if (colon != std::string::npos) {
    if (name != "fp8")
      throw UserError("--modes: \"" + mode + "\": a recipe goes with fp8 only (fp8:delayed, fp8:current, fp8:block)");
    overrides.push_back("precision.fp8.recipe=" + mode.substr(colon + 1));
  }
  // A rollback falls back from FP8 to bf16: a mode without FP8 has nothing to fall back from,
  // so its guard stops instead (compare names a mode that diverged).
  if (base.training.guard.action == GuardAction::rollback && name != "fp8") overrides.push_back("training.guard.action=stop");
  return overrides;
}

std::string mode_label(const Config& c) { return resolve_precision(c).label(); }

}  // namespace

Config config_for_mode(const Config& base, const std::string& mode, const CompareOptions& options) {
  // The mode as --set overrides on the resolved config, validated as any config is: the mode's
  // own checks (fp8 shapes, block sizes, the schedule's steps) apply, and an unknown mode is
  // named by the parser.
  std::vector<std::string> overrides = mode_overrides(base, mode);
  if (options.steps > 0) overrides.push_back("training.steps=" + std::to_string(options.steps));
  Config c;
  try {
    c = parse_config(config_to_yaml(base), "--modes " + mode, overrides);
  } catch (const UserError& e) {
    throw UserError("--modes: mode \"" + mode + "\" cannot run this config: " + e.what());
  }
  std::string tag = mode_label(c);  // "fp8:current>bf16@450" -> "fp8-current-bf16-450"
  for (char& ch : tag)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '.' && ch != '_') ch = '-';
  c.run.name = base.run.name + "-" + tag;
  c.run.out_dir = (fs::path(options.out_dir) / "runs").string();
  c.run.overwrite = true;  // the compare directory's own runs: an unfinished or stale one is redone
  c.checkpoint.resume = "never";
  c.checkpoint.dir.clear();
  return c;
}

namespace {

// A finished run (it wrote summary.json) of exactly this config can stand in for training it again.
bool finished_run_of(const Config& c) {
  const fs::path dir = fs::path(c.run.out_dir) / c.run.name;
  if (!fs::exists(dir / "summary.json") || !fs::exists(dir / "config.yaml")) return false;
  try {
    return config_to_yaml(load_config((dir / "config.yaml").string())) == config_to_yaml(c);
  } catch (const UserError&) {
    return false;
  }
}

// What both forms of compare check before they train or write anything; returns the report
// directory resolved (train/output_policy.h), where the report and the runs go.
std::string check_options(const CompareOptions& options) {
  if (!std::isfinite(options.tolerance_pct) || options.tolerance_pct < 0)
    throw UserError("--tolerance: " + number_text(options.tolerance_pct) +
                    " is not a percentage; expected a finite number >= 0");
  if (options.target_loss && !(std::isfinite(*options.target_loss) && *options.target_loss > 0))
    throw UserError("--target-loss: " + number_text(*options.target_loss) +
                    " is not a loss; expected a finite number > 0 (a validation loss, in nats)");
  // An earlier compare's directory is continued (its finished runs reused) while it has no
  // report; its report is replaced only with --force.
  const auto made_by_compare = [](const fs::path& dir) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string name = it->path().filename().string();
      const fs::file_type type = it->symlink_status(ec).type();
      const bool report = type == fs::file_type::regular && (name == "report.md" || name == "report.html" ||
                                                              fs::path(name).extension() == ".svg");
      if (!report && !(name == "runs" && type == fs::file_type::directory)) return false;
    }
    return !ec;
  };
  std::error_code ec;
  const bool unfinished = fs::is_directory(options.out_dir, ec) && !fs::exists(fs::path(options.out_dir) / "report.md", ec) &&
                          made_by_compare(options.out_dir);
  return plan_output(options.out_dir, OutputRule{"--out", true, "ptrain compare", options.force || unfinished,
                                                 made_by_compare});
}

// The newest checkpoint of a run (`latest` in its checkpoint directory), which --int8-eval
// evaluates once it has checked it is of the run's last step. Throws UserError naming the run
// when there is none.
std::string final_checkpoint(const RunRecord& r, const Config& config) {
  const fs::path dir = config.checkpoint.dir.empty() ? fs::path(r.dir) / "checkpoints" : fs::path(config.checkpoint.dir);
  const std::string why = "--int8-eval: run \"" + r.dir + "\" has no checkpoint of its last step (" +
                          std::to_string(r.steps.back()) + ") in " + dir.string() +
                          "; expected one (checkpoint.save_final: true, the default)";
  if (!fs::exists(dir / "latest")) throw UserError(why);
  return (dir / "latest").string();
}

void add_int8_eval(RunRecord& r) {
  const Config config = load_config((fs::path(r.dir) / "config.yaml").string());
  const std::string checkpoint = final_checkpoint(r, config);
  const CheckpointLosses l = checkpoint_val_losses(config, checkpoint, WeightFormat::int8);
  if (l.step != r.steps.back())
    throw UserError("--int8-eval: run \"" + r.dir + "\"'s newest checkpoint is of step " + std::to_string(l.step) +
                    ", not its last step (" + std::to_string(r.steps.back()) + "); expected the final checkpoint");
  r.final_checkpoint_val_loss = l.fp32;
  r.int8_val_loss = l.int8;
}

// What the run's mode holds on a GPU, whatever device it trained on: on the CPU backend the
// narrow formats live in FP32 storage, so only the CUDA backend's plan says what a mode saves.
// Absent where the CUDA backend would refuse the config (model.attention: cudnn with FP32
// activations).
void add_gpu_plan(RunRecord& r) {
  const Config config = load_config((fs::path(r.dir) / "config.yaml").string());
  if (config.training.batch_tokens % (config.training.micro_batch * int64_t{config.training.effective_seq_len(config.model)} * r.ranks) != 0)
    throw UserError("run \"" + r.dir + "\": training.batch_tokens (" + std::to_string(config.training.batch_tokens) +
                    ") is not a whole number of micro-batches on its " + std::to_string(r.ranks) +
                    " ranks (summary.json); expected the files a ptrain run writes");
  const RunSpec spec = resolve_run(config, r.ranks);
  AttentionPath attention;
  try {
    attention = expected_gpu_attention(spec, config.model.attention);
  } catch (const UserError&) {
    return;
  }
  const GpuMemoryPlan plan = plan_gpu_memory(spec, config.distributed, attention);
  r.gpu_plan_mib = static_cast<double>(plan.total()) / (1024.0 * 1024.0);
  r.gpu_plan_state_bytes_per_param = static_cast<double>(plan.model_state()) / static_cast<double>(plan.parameters);
}

Comparison finish(std::vector<RunRecord> runs, const CompareOptions& options) {
  const std::string reference = options.reference.empty() ? runs.front().mode : options.reference;
  for (RunRecord& r : runs) add_gpu_plan(r);
  if (options.int8_eval) {
    compare_runs(runs, reference, options.tolerance_pct, options.target_loss);  // refuses bad runs before evaluating
    for (RunRecord& r : runs) add_int8_eval(r);
  }
  Comparison c = compare_runs(std::move(runs), reference, options.tolerance_pct, options.target_loss);
  write_report(c, options.out_dir);
  return c;
}

}  // namespace

Comparison compare_modes(const Config& base, const CompareOptions& given) {
  if (given.modes.size() < 2) throw UserError("--modes: name at least two modes, e.g. --modes fp32,bf16");
  CompareOptions options = given;
  options.out_dir = check_options(given);
  // Every mode is resolved and its run planned (data, directories) before the first trains: a
  // mistake in the last mode must not cost the training of the others.
  std::vector<Config> configs;
  std::vector<std::string> labels;
  for (const std::string& mode : options.modes) {
    configs.push_back(config_for_mode(base, mode, options));
    const std::string label = mode_label(configs.back());
    if (std::find(labels.begin(), labels.end(), label) != labels.end())
      throw UserError("--modes: \"" + mode + "\" is " + label + ", which is already among the modes; expected each mode once");
    labels.push_back(label);
  }
  CompareOptions resolved = options;  // the reference as a mode label
  if (!options.reference.empty()) {
    resolved.reference = mode_label(config_for_mode(base, options.reference, options));
    if (std::find(labels.begin(), labels.end(), resolved.reference) == labels.end())
      throw UserError("--reference: \"" + options.reference + "\" is not among --modes; expected one of them");
  }
  for (const Config& c : configs) {
    if (options.int8_eval && !c.checkpoint.save_final)
      throw UserError("--int8-eval: checkpoint.save_final is false, so the runs keep no final checkpoint to evaluate; "
                      "expected true (the default)");
    plan_run(c);
  }
  RunLog log;
  std::vector<RunRecord> runs;
  for (const Config& c : configs) {
    const std::string dir = (fs::path(c.run.out_dir) / c.run.name).string();
    if (finished_run_of(c)) {
      log.info("compare: reusing the finished run " + dir);
    } else {
      log.info("compare: training " + dir + " (" + mode_label(c) + ")");
      TrainResult result;
      try {
        result = train(c, TrainOptions{});
      } catch (const DivergedError& e) {
        throw DivergedError("compare: mode " + mode_label(c) + " diverged, so no "
                            "report was written (the finished runs stay in " + c.run.out_dir +
                            " and are reused): " + e.what());
      }
      if (result.interrupted) throw EnvironmentError("compare: the run " + dir + " was interrupted; run compare again to finish it");
    }
    runs.push_back(read_run(dir));
  }
  return finish(std::move(runs), resolved);
}

Comparison compare_run_dirs(const std::vector<std::string>& run_dirs, const CompareOptions& given) {
  if (run_dirs.size() < 2) throw UserError("compare: give a config, or at least two run directories");
  CompareOptions options = given;
  options.out_dir = check_options(given);
  std::vector<RunRecord> runs;
  for (const std::string& dir : run_dirs) runs.push_back(read_run(dir));
  return finish(std::move(runs), options);
}

}  // namespace ptrain
