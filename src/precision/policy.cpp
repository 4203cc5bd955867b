#include "precision/policy.h"

#include "core/error.h"

namespace ptrain {

static Fp8Recipe recipe_from(const std::string& name) {
  if (name == "current") return Fp8Recipe::current;
  if (name == "block") return Fp8Recipe::block;
  PTRAIN_CHECK(name == "delayed", "unknown fp8 recipe " + name);  // the config validated it
  return Fp8Recipe::delayed;
}

PrecisionPolicy PrecisionPolicy::from_config(const PrecisionConfig& config) {
  PrecisionPolicy p;
  p.mode = config.mode;
  const Format low = config.mode == "fp16" ? Format::fp16 : config.mode == "fp32" ? Format::fp32 : Format::bf16;
  p.weights = p.activations = p.grads = low;
  if (config.mode == "fp8") {
    const Fp8Config& f = config.fp8;
    p.fp8.enabled = true;
    p.fp8.recipe = recipe_from(f.recipe);
    // Block scaling is E4M3 throughout (DeepSeek-V3, TransformerEngine Float8BlockScaling).
    p.fp8.backward = (f.format == "e4m3" || p.fp8.recipe == Fp8Recipe::block) ? Format::e4m3 : Format::e5m2;
    p.fp8.margin = f.margin;
    p.fp8.amax_history = f.amax_history;
    p.fp8.amax_algo = f.amax_algo == "most_recent" ? AmaxAlgo::most_recent : AmaxAlgo::max;
    p.fp8.bf16_first_last = f.bf16_first_last;
    p.fp8.bf16_lm_head = f.bf16_lm_head;
    p.fp8.block = f.block_size;
  }
  p.loss_scaling = config.loss_scaling;
  if (p.loss_scaling.mode == "auto") p.loss_scaling.mode = config.mode == "fp16" ? "dynamic" : "off";
  return p;
}

std::string PrecisionPolicy::label() const {
  if (!fp8.enabled) return mode;
  const char* recipe = fp8.recipe == Fp8Recipe::delayed ? "delayed" : fp8.recipe == Fp8Recipe::current ? "current" : "block";
  return mode + ":" + recipe;
}

}  // namespace ptrain
