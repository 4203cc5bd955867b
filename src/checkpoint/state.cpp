#include "checkpoint/state.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/sha256.h"
#include "core/bits.h"
#include "core/error.h"
#include "precision/policy.h"

namespace ptrain {
namespace {

using json = nlohmann::json;

// Steps, tokens and sample indices far beyond any run, yet exact in a double and free of overflow
// when multiplied by a batch size.
constexpr int64_t kMaxCount = int64_t{1} << 50;

[[noreturn]] void bad(const std::string& field, const json& value, const std::string& expected) {
  std::string shown = value.dump();
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  throw UserError("state.json field " + field + ": " + shown + " is not valid; expected " + expected);
}

const json& member(const json& j, const std::string& parent, const char* key) {
  if (!j.is_object()) bad(parent.empty() ? "(top level)" : parent, j, "an object");
  const auto it = j.find(key);
  const std::string field = parent.empty() ? key : parent + "." + key;
  if (it == j.end()) throw UserError("state.json has no field " + field + "; expected the state a ptrain checkpoint holds");
  return *it;
}

std::string range_text(int64_t lo, int64_t hi) { return "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]"; }

int64_t integer(const json& j, const std::string& parent, const char* key, int64_t lo, int64_t hi) {
  const json& v = member(j, parent, key);
  const std::string field = parent.empty() ? key : parent + "." + key;
  // nlohmann keeps integers above INT64_MAX as unsigned and fractions as floats: both refused.
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)))
    bad(field, v, range_text(lo, hi));
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) bad(field, v, range_text(lo, hi));
  return x;
}

uint64_t unsigned_integer(const json& j, const std::string& parent, const char* key) {
  const json& v = member(j, parent, key);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
    bad(parent + "." + key, v, "a non-negative integer");
  return v.get<uint64_t>();
}

std::string text(const json& j, const std::string& parent, const char* key, const std::vector<std::string>& choices) {
  const json& v = member(j, parent, key);
  const std::string field = parent.empty() ? key : parent + "." + key;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  if (!v.is_string()) bad(field, v, "one of " + list);
  const std::string s = v.get<std::string>();
  for (const auto& c : choices)
    if (s == c) return s;
  bad(field, v, "one of " + list);
}

// A choice key (config/choices.h), read by the names the config uses; `allowed` narrows them.
template <typename E>
E choice(const json& j, const std::string& parent, const char* key, std::vector<E> allowed = {}) {
  if (allowed.empty())
    for (size_t i = 0; i < ChoiceNames<E>::names.size(); ++i) allowed.push_back(static_cast<E>(i));
  std::vector<std::string> names;
  for (const E e : allowed) names.push_back(choice_name(e));
  return *parse_choice<E>(text(j, parent, key, names));
}

float float_from_bits(const json& v, const std::string& field) {
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) bad(field, v, "a float's 32-bit pattern");
  const uint64_t bits = v.get<uint64_t>();
  if (bits > 0xFFFFFFFFu) bad(field, v, "a float's 32-bit pattern");
  return bits_as_float(static_cast<uint32_t>(bits));
}

// A short fingerprint of the model-relevant config, for tools that compare checkpoints.
std::string model_hash(const json& model) {
  const std::string dumped = model.dump();
  Sha256 h;
  h.update(dumped.data(), dumped.size());
  return h.hex_digest().substr(0, 16);
}

}  // namespace

json state_to_json(const CheckpointState& s) {
  json fp8 = json::array();
  // FP8 histories may hold NaN or inf (an overflowed step), which JSON cannot: they are stored as
  // the floats' bit patterns, exact whatever the value.
  for (const auto& f : s.fp8) {
    std::vector<uint32_t> history;
    for (float h : f.history) history.push_back(float_as_bits(h));
    fp8.push_back({{"name", f.name},
                   {"history_bits", history},
                   {"scale_bits", float_as_bits(f.scale)},
                   {"scale", std::isfinite(f.scale) ? json(f.scale) : json()}});  // for people
  }
  return {{"format", "ptrain checkpoint 1"},
          {"format_version", kStateFormatVersion},
          {"step", s.step},
          {"tokens", s.tokens},
          {"optimizer_steps", s.optimizer_steps},
          // The only random state after initialisation: the counter-based training sampler.
          {"rng", {{"data_sampler", {{"seed", s.data_seed}, {"next_sample", s.next_sample}}}}},
          {"loss_scaler",
           {{"mode", s.scaler_mode},
            {"scale", s.scaler.scale},
            {"growth_tracker", s.scaler.growth_tracker},
            {"hysteresis_left", s.scaler.hysteresis_left},
            {"skipped", s.scaler.skipped}}},
          {"guard", {{"window", s.guard.window},
                     {"spike_run", s.guard.spike_run},
                     {"skipped", s.guard.skipped},
                     {"consecutive_skips", s.guard.consecutive_skips},
                     // A resume inside a rollback's bf16 fallback stays in it until its end.
                     {"rollback",
                      {{"to_step", s.guard.rollback.to_step},
                       {"fallback_last", s.guard.rollback.fallback_last},
                       {"count", s.guard.rollback.count}}}}},
          {"fp8", fp8},
          {"best_val_loss", std::isfinite(s.best_val_loss) ? json(s.best_val_loss) : json()},
          {"best_val_step", s.best_val_step},
          {"precision", s.precision},
          {"tokenizer", s.tokenizer.empty() ? json() : json(s.tokenizer)},
          {"vocabulary_sha256", s.vocabulary_sha256.empty() ? json() : json(s.vocabulary_sha256)},
          {"model", s.model},
          {"model_hash", model_hash(s.model)},
          {"schedule", s.schedule}};
}

CheckpointState state_from_json(const json& j) {
  if (!j.is_object()) bad("(top level)", j, "a JSON object");
  if (!j.contains("format") || j["format"] != "ptrain checkpoint 1")
    throw UserError("state.json is not a ptrain checkpoint state (no \"format\": \"ptrain checkpoint 1\")");
  const int64_t version = j.contains("format_version") ? integer(j, "", "format_version", 1, 1 << 20) : 1;
  if (version > kStateFormatVersion)
    throw NewerCheckpointFormat("state.json has format_version " + std::to_string(version) +
                                ", written by a newer ptrain; this one reads versions up to " +
                                std::to_string(kStateFormatVersion) + " (use the ptrain that wrote it)");
  CheckpointState s;
  s.step = integer(j, "", "step", 0, kMaxCount);
  s.tokens = integer(j, "", "tokens", 0, kMaxCount);
  s.optimizer_steps = integer(j, "", "optimizer_steps", 0, s.step);
  const json& sampler = member(member(j, "", "rng"), "rng", "data_sampler");
  s.data_seed = unsigned_integer(sampler, "rng.data_sampler", "seed");
  s.next_sample = integer(sampler, "rng.data_sampler", "next_sample", 0, kMaxCount);

  const json& ls = member(j, "", "loss_scaler");
  s.scaler_mode = choice<LossScalingMode>(ls, "loss_scaler", "mode",
                                         {LossScalingMode::off, LossScalingMode::static_, LossScalingMode::dynamic});
  const json& scale = member(ls, "loss_scaler", "scale");
  if (!scale.is_number() || !std::isfinite(scale.get<double>()) || scale.get<double>() <= 0)
    bad("loss_scaler.scale", scale, "a finite number > 0");
  s.scaler.scale = scale.get<double>();
  s.scaler.growth_tracker = integer(ls, "loss_scaler", "growth_tracker", 0, kMaxCount);
  // Below 0 in checkpoints of earlier versions, which let the spent counter fall (it means 0).
  s.scaler.hysteresis_left = static_cast<int>(integer(ls, "loss_scaler", "hysteresis_left", -(1 << 30), 1 << 30));
  s.scaler.skipped = integer(ls, "loss_scaler", "skipped", 0, s.step);

  if (j.contains("guard")) {  // absent before the divergence guard
    const json& g = j["guard"];
    const json& window = member(g, "guard", "window");
    if (!window.is_array() || window.size() > (1u << 20)) bad("guard.window", window, "a list of losses");
    for (const json& v : window) {
      if (!v.is_number() || !std::isfinite(v.get<double>())) bad("guard.window", v, "a finite loss");
      s.guard.window.push_back(v.get<double>());
    }
    s.guard.spike_run = static_cast<int>(integer(g, "guard", "spike_run", 0, 1 << 30));
    s.guard.skipped = integer(g, "guard", "skipped", 0, s.step);
    s.guard.consecutive_skips = static_cast<int>(integer(g, "guard", "consecutive_skips", 0, s.guard.skipped));
    if (g.contains("rollback")) {  // absent before the guard's rollback
      const json& r = g["rollback"];
      s.guard.rollback.to_step = integer(r, "guard.rollback", "to_step", -1, s.step - 1);
      s.guard.rollback.count = integer(r, "guard.rollback", "count", s.guard.rollback.to_step >= 0 ? 1 : 0, s.step);
      if (s.guard.rollback.to_step >= 0) {
        s.guard.rollback.fallback_last = integer(r, "guard.rollback", "fallback_last", -1, kMaxCount);
        if (s.guard.rollback.fallback_last >= 0 && s.guard.rollback.fallback_last <= s.guard.rollback.to_step)
          bad("guard.rollback.fallback_last", r["fallback_last"], "-1 or a step after guard.rollback.to_step");
      }
    }
  }

  const json& fp8 = member(j, "", "fp8");
  if (!fp8.is_array()) bad("fp8", fp8, "a list");
  for (size_t i = 0; i < fp8.size(); ++i) {
    const std::string at = "fp8[" + std::to_string(i) + "]";
    const json& f = fp8[i];
    Fp8ScalingState t;
    const json& name = member(f, at, "name");
    if (!name.is_string()) bad(at + ".name", name, "a tensor name");
    t.name = name.get<std::string>();
    const json& history = member(f, at, "history_bits");
    if (!history.is_array() || history.size() > (1u << 20)) bad(at + ".history_bits", history, "a list of float bit patterns");
    for (const json& h : history) t.history.push_back(float_from_bits(h, at + ".history_bits"));
    t.scale = float_from_bits(member(f, at, "scale_bits"), at + ".scale_bits");
    if (!std::isfinite(t.scale) || t.scale <= 0) bad(at + ".scale_bits", f["scale_bits"], "the bits of a finite scale > 0");
    s.fp8.push_back(std::move(t));
  }

  const json& best = member(j, "", "best_val_loss");
  if (best.is_number()) s.best_val_loss = best.get<double>();
  else if (!best.is_null()) bad("best_val_loss", best, "a number or null");
  s.best_val_step = integer(j, "", "best_val_step", -1, s.step);
  s.precision = text(j, "", "precision", precision_labels());
  // Checkpoints from before tokenizers were recorded have none: unknown.
  if (j.contains("tokenizer") && !j["tokenizer"].is_null()) {
    const auto& names = ChoiceNames<TokenizerChoice>::names;  // "auto" is a config value, not a tokenizer
    s.tokenizer = text(j, "", "tokenizer", std::vector<std::string>(names.begin() + 1, names.end()));
  }
  if (j.contains("vocabulary_sha256") && !j["vocabulary_sha256"].is_null()) {
    const json& hash = j["vocabulary_sha256"];
    if (!hash.is_string() || !is_sha256_hex(hash.get<std::string>()))
      bad("vocabulary_sha256", hash, "null or 64 lowercase hexadecimal digits");
    s.vocabulary_sha256 = hash.get<std::string>();
  }
  s.model = member(j, "", "model");
  model_from_json(s.model);  // checked here, so that no reader builds a model from a bad shape
  // The fingerprint is of the section as written: a section edited afterwards no longer matches.
  if (j.contains("model_hash")) {
    const json& hash = j["model_hash"];
    if (!hash.is_string() || hash.get<std::string>() != model_hash(s.model))
      bad("model_hash", hash, "\"" + model_hash(s.model) + "\", the fingerprint of the model section (the section "
          "or the hash was edited)");
  }
  s.schedule = member(j, "", "schedule");
  if (!s.schedule.is_object()) bad("schedule", s.schedule, "an object");
  return s;
}

// GPT-2's keys are those of checkpoints from before model.arch; llama's add its settings,
// resolved (no 0 = default left), so that a resume compares what the model is.
json model_json(const ModelConfig& m) {
  json j = {{"n_layer", m.n_layer}, {"n_head", m.n_head}, {"n_embd", m.n_embd}, {"seq_len", m.seq_len},
            {"vocab_size", m.vocab_size}};
  if (m.arch != Arch::llama) return j;
  j["arch"] = m.arch;
  j["n_kv_head"] = m.kv_heads();
  j["mlp_hidden"] = m.swiglu_hidden();
  j["rope_theta"] = m.rope_theta;
  j["norm_eps"] = m.norm_eps;
  j["tie_embeddings"] = m.tie_embeddings == TieEmbeddings::yes;
  if (m.qk_norm) j["qk_norm"] = true;  // absent: off, as in checkpoints from before the key
  return j;
}

static double positive_number(const json& j, const char* key) {
  const json& v = member(j, "model", key);
  if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
    bad(std::string("model.") + key, v, "a positive number");
  return v.get<double>();
}

// Only the keys model_json writes for the model's arch: one reading of the section for every
// command (an unknown key would be dropped by some readers and compared by others).
void refuse_unknown_model_keys(const json& j) {
  if (!j.is_object()) bad("model", j, "an object");
  const bool llama = j.contains("arch") && j["arch"] == "llama";
  static const std::set<std::string> gpt2 = {"arch", "n_layer", "n_head", "n_embd", "seq_len", "vocab_size"};
  static const std::set<std::string> llama_only = {"n_kv_head", "mlp_hidden", "rope_theta", "norm_eps",
                                                   "tie_embeddings", "qk_norm"};
  for (const auto& [key, value] : j.items())
    if (!gpt2.count(key) && !(llama && llama_only.count(key)))
      throw UserError("state.json field model." + key.substr(0, 64) + " is not a key of a " +
                      std::string(llama ? "llama" : "gpt2") + " model's section; expected only the keys ptrain writes");
}

ModelConfig model_from_json(const json& j) {
  refuse_unknown_model_keys(j);
  ModelConfig m;
  m.n_layer = static_cast<int>(integer(j, "model", "n_layer", 1, kMaxLayers));
  m.n_embd = static_cast<int>(integer(j, "model", "n_embd", 1, kMaxEmbd));
  m.n_head = static_cast<int>(integer(j, "model", "n_head", 1, m.n_embd));
  if (m.n_embd % m.n_head != 0)
    bad("model.n_head", j["n_head"], "a divisor of model.n_embd " + std::to_string(m.n_embd));
  m.seq_len = static_cast<int>(integer(j, "model", "seq_len", 1, kMaxSeqLen));
  m.vocab_size = static_cast<int>(integer(j, "model", "vocab_size", 2, kMaxVocab));
  if (!j.contains("arch")) return m;  // GPT-2
  m.arch = choice<Arch>(j, "model", "arch");
  if (m.arch == Arch::gpt2) return m;
  m.n_kv_head = static_cast<int>(integer(j, "model", "n_kv_head", 1, m.n_head));
  if (m.n_head % m.n_kv_head != 0) bad("model.n_kv_head", j["n_kv_head"], "a divisor of model.n_head");
  if ((m.n_embd / m.n_head) % 2 != 0)
    bad("model.n_head", j["n_head"], "a head count that leaves an even head size (RoPE turns pairs)");
  m.mlp_hidden = static_cast<int>(integer(j, "model", "mlp_hidden", 1, 4 * int64_t{kMaxEmbd}));
  m.rope_theta = positive_number(j, "rope_theta");
  m.norm_eps = positive_number(j, "norm_eps");
  const json& tie = member(j, "model", "tie_embeddings");
  if (!tie.is_boolean()) bad("model.tie_embeddings", tie, "true or false");
  m.tie_embeddings = tie.get<bool>() ? TieEmbeddings::yes : TieEmbeddings::no;
  if (j.contains("qk_norm")) {
    const json& qk = j["qk_norm"];
    if (!qk.is_boolean()) bad("model.qk_norm", qk, "true or false");
    m.qk_norm = qk.get<bool>();
  }
  return m;
}

// Over the keys of either side, so that a llama checkpoint meets a GPT-2 config's missing keys
// too; a missing arch is GPT-2's (model_json leaves it out).
std::vector<std::string> model_differences(const json& saved, const json& current) {
  const auto with_arch = [](json j) {
    if (j.is_object() && !j.contains("arch")) j["arch"] = "gpt2";
    return j;
  };
  const json a = with_arch(saved), b = with_arch(current);
  std::vector<std::string> out;
  const auto shown = [](const json& j, const std::string& key) { return j.contains(key) ? j[key].dump() : "absent"; };
  for (const auto& [key, value] : b.items())
    if (!a.contains(key) || a[key] != value)
      out.push_back("model." + key + " " + shown(a, key) + " in the checkpoint vs " + value.dump() + " now");
  for (const auto& [key, value] : a.items())
    if (!b.contains(key)) out.push_back("model." + key + " " + value.dump() + " in the checkpoint vs absent now");
  return out;
}

}  // namespace ptrain
