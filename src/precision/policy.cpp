#include "precision/policy.h"

#include "core/error.h"

namespace ptrain {

PrecisionPolicy PrecisionPolicy::from_config(const PrecisionConfig& scheduled) {
  const PrecisionConfig config = scheduled.schedule.empty() ? scheduled : phase_precision(scheduled, 0);
  PrecisionPolicy p;
  p.mode = config.mode;
  const Format low = config.mode == PrecisionMode::fp16   ? Format::fp16
                     : config.mode == PrecisionMode::fp32 ? Format::fp32
                                                          : Format::bf16;
  p.weights = p.activations = p.activation_grads = low;
  if (config.mode == PrecisionMode::fp8) {
    const Fp8Config& f = config.fp8;
    p.fp8.enabled = true;
    p.fp8.recipe = f.recipe;
    // Block scaling is E4M3 throughout (DeepSeek-V3, TransformerEngine Float8BlockScaling).
    p.fp8.backward = (f.format == Fp8Format::e4m3 || p.fp8.recipe == Fp8Recipe::block) ? Format::e4m3 : Format::e5m2;
    p.fp8.margin = f.margin;
    p.fp8.amax_history = f.amax_history;
    p.fp8.amax_algo = f.amax_algo;
    p.fp8.bf16_first_last = f.bf16_first_last;
    p.fp8.bf16_lm_head = f.bf16_lm_head;
    p.fp8.primary_weights = f.primary_weights;
    p.fp8.mlp_input_codes = f.mlp_input_codes;
    p.fp8.block = f.block_size;
  }
  p.loss_scaling = config.loss_scaling;
  if (p.loss_scaling.mode == LossScalingMode::auto_)
    p.loss_scaling.mode = config.mode == PrecisionMode::fp16 ? LossScalingMode::dynamic : LossScalingMode::off;
  return p;
}

namespace {
std::string fp8_label(Fp8Recipe recipe, bool primary_weights, bool mlp_input_codes) {
  return std::string("fp8:") + choice_name(recipe) + (primary_weights ? "+primary" : "") +
         (mlp_input_codes ? "+codes" : "");
}
}  // namespace

std::string PrecisionPolicy::label() const {
  if (!fp8.enabled) return choice_name(mode);
  return fp8_label(fp8.recipe, fp8.primary_weights, fp8.mlp_input_codes);
}

std::vector<std::string> precision_labels() {
  std::vector<std::string> labels;
  for (const PrecisionMode mode : {PrecisionMode::fp32, PrecisionMode::bf16, PrecisionMode::fp16})
    labels.push_back(choice_name(mode));
  for (const Fp8Recipe recipe : {Fp8Recipe::delayed, Fp8Recipe::current, Fp8Recipe::block})
    for (const bool primary : {false, true})
      for (const bool codes : {false, true}) labels.push_back(fp8_label(recipe, primary, codes));
  return labels;
}

PrecisionSchedule PrecisionSchedule::from_config(const PrecisionConfig& config, int64_t steps) {
  PrecisionSchedule s;
  if (config.schedule.empty()) {
    s.phases.push_back({PrecisionPolicy::from_config(config), steps});
    return s;
  }
  for (size_t i = 0; i < config.schedule.size(); ++i)
    s.phases.push_back({PrecisionPolicy::from_config(phase_precision(config, i)),
                        i + 1 == config.schedule.size() ? steps : phase_last_step(config.schedule[i], steps)});
  return s;
}

size_t PrecisionSchedule::phase_at(int64_t step) const {
  for (size_t i = 0; i + 1 < phases.size(); ++i)
    if (step <= phases[i].last_step) return i;
  return phases.size() - 1;
}

std::string PrecisionSchedule::label() const {
  std::string modes, ends;
  for (size_t i = 0; i < phases.size(); ++i) {
    modes += (i ? ">" : "") + phases[i].policy.label();
    if (i + 1 < phases.size()) ends += (i ? "," : "") + std::to_string(phases[i].last_step);
  }
  return ends.empty() ? modes : modes + "@" + ends;
}

std::string PrecisionSchedule::describe() const {
  std::string text;
  int64_t first = 1;
  for (size_t i = 0; i < phases.size(); ++i) {
    text += (i ? ", then " : "") + phases[i].policy.label() + " for steps " + std::to_string(first) + "-" +
            std::to_string(phases[i].last_step);
    first = phases[i].last_step + 1;
  }
  return text;
}

}  // namespace ptrain
