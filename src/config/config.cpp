// YAML run config -> Config. One schema table binds every dotted key to its struct member;
// parsing, `--set` overrides, unknown-key detection and YAML output all walk that table, so a
// new key is one line in make_schema(). Problems are collected, never thrown one at a time.
#include "config/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <initializer_list>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/input_file.h"
#include "core/utf8.h"

namespace ptrain {
namespace {

// ---- The schema -------------------------------------------------------------------------------

// An enum member (config/choices.h), read and written by its index in the field's choices.
struct ChoiceRef {
  std::function<size_t()> get;
  std::function<void(size_t)> set;
};
using Target = std::variant<int*, int64_t*, double*, bool*, std::string*, ChoiceRef>;

// Allowed numeric interval; unbounded sides are infinite.
struct Range {
  double lo = -INFINITY;
  double hi = INFINITY;
  bool lo_open = false;
  bool hi_open = false;
};

Range at_least(double lo) { return {lo, INFINITY, false, false}; }
Range above(double lo) { return {lo, INFINITY, true, false}; }
Range between(double lo, double hi, bool lo_open = false, bool hi_open = false) {
  return {lo, hi, lo_open, hi_open};
}

// How an empty string appears in YAML: as "" , as null, or not at all (data.train/val).
enum class Empty { kString, kNull, kOmit };

struct Field {
  std::string key;  // dotted path, e.g. "precision.fp8.recipe"
  Target target;
  std::string help;
  Range range;                       // numbers only
  std::vector<std::string> choices;  // choice keys' names, in the order ChoiceRef indexes
  Empty empty = Empty::kString;
  bool required = false;
};

Field field(std::string key, Target target, std::string help) {
  Field f;
  f.key = std::move(key);
  f.target = target;
  f.help = std::move(help);
  return f;
}
template <class T>
Field number(std::string key, T* member, Range range, std::string help) {
  Field f = field(std::move(key), member, std::move(help));
  f.range = range;
  return f;
}
Field required(Field f) {
  f.required = true;
  return f;
}
Field flag(std::string key, bool* member, std::string help) {
  return field(std::move(key), member, std::move(help));
}
// An enum key; `allowed` narrows its values (default: all of the enum's names).
template <class E>
Field choice(std::string key, E* member, std::string help, std::vector<E> allowed = {}) {
  if (allowed.empty())
    for (size_t i = 0; i < ChoiceNames<E>::names.size(); ++i) allowed.push_back(static_cast<E>(i));
  ChoiceRef ref;
  ref.get = [member, allowed] {
    return static_cast<size_t>(std::find(allowed.begin(), allowed.end(), *member) - allowed.begin());
  };
  ref.set = [member, allowed](size_t i) { *member = allowed.at(i); };
  Field f = field(std::move(key), ref, std::move(help));
  for (const E e : allowed) f.choices.push_back(choice_name(e));
  return f;
}
Field text(std::string key, std::string* member, std::string help, Empty empty = Empty::kString) {
  Field f = field(std::move(key), member, std::move(help));
  f.empty = empty;
  return f;
}

struct Schema {
  std::vector<Field> fields;  // in output order; keys of a section are contiguous
  // Sections whose mere presence is a setting (data.synthetic switches the synthetic corpus on).
  std::map<std::string, bool*> presence;
};

// The table binds members of `c`, so it is valid only while `c` lives and is not moved.
Schema make_schema(Config& c) {
  RunConfig& r = c.run;
  ModelConfig& m = c.model;
  DataConfig& d = c.data;
  SyntheticDataConfig& s = c.data.synthetic;
  TrainingConfig& t = c.training;
  OptimizerConfig& o = c.optimizer;
  ScheduleConfig& sc = c.schedule;
  PrecisionConfig& p = c.precision;
  Fp8Config& f8 = c.precision.fp8;
  LossScalingConfig& ls = c.precision.loss_scaling;
  CheckpointConfig& ck = c.checkpoint;
  Schema schema;
  schema.fields = {
      text("run.name", &r.name, "run directory name under out_dir"),
      text("run.out_dir", &r.out_dir, "parent folder of run directories"),
      number("run.seed", &r.seed, Range{}, "seed of parameter init and data order"),
      choice("run.device", &r.device, "auto picks cuda when present"),
      flag("run.overwrite", &r.overwrite, "replace an existing run directory"),

      required(number("model.n_layer", &m.n_layer, between(1, kMaxLayers), "transformer blocks")),
      required(number("model.n_head", &m.n_head, between(1, kMaxEmbd), "attention heads")),
      required(number("model.n_embd", &m.n_embd, between(1, kMaxEmbd), "width; a multiple of n_head")),
      required(number("model.seq_len", &m.seq_len, between(1, kMaxSeqLen), "context length")),
      required(number("model.vocab_size", &m.vocab_size, between(2, kMaxVocab),
                      "tokens (ids past 65,535 take uint32 shards); padded to a multiple of 128 internally")),
      text("model.init_from", &m.init_from, "llm.c model file or Hugging Face model directory to start from; null = random init",
           Empty::kNull),
      choice("model.attention", &m.attention,
             "attention implementation on GPU"),
      flag("model.fused_gelu", &m.fused_gelu,
           "GPU: GELU in the epilogues of the GEMMs beside it (the CPU computes the same ops apart)"),
      number("model.init_std", &m.init_std, between(0, 10, true),
             "std of the initial weights (residual projections: / sqrt(2 n_layer))"),
      choice("model.arch", &m.arch,
             "gpt2 (LayerNorm, learned positions, GELU, biases) or llama (RMSNorm, RoPE, SwiGLU, GQA, no biases)"),
      number("model.n_kv_head", &m.n_kv_head, between(0, kMaxEmbd),
             "llama: key/value heads (grouped-query attention; n_head a multiple of it); 0 = n_head"),
      number("model.rope_theta", &m.rope_theta, between(0, 1e12, true), "llama: RoPE base (Llama 3 uses 500000)"),
      number("model.norm_eps", &m.norm_eps, between(0, 1, true), "llama: RMSNorm epsilon"),
      number("model.mlp_hidden", &m.mlp_hidden, between(0, 4 * kMaxEmbd),
             "llama: SwiGLU width; 0 = 2/3 of 4 n_embd rounded up to mlp_multiple_of"),
      number("model.mlp_multiple_of", &m.mlp_multiple_of, between(1, kMaxEmbd),
             "llama: the default SwiGLU width is rounded up to a multiple of this"),
      choice("model.tie_embeddings", &m.tie_embeddings,
             "LM head shares the token embedding; auto = gpt2 tied, llama untied"),
      flag("model.qk_norm", &m.qk_norm,
           "llama: RMSNorm on each q and k head before RoPE (a head_size weight per layer for each)"),

      text("data.train", &d.train, "glob of llm.c token shards", Empty::kOmit),
      text("data.val", &d.val, "glob of llm.c token shards", Empty::kOmit),
      choice("data.tokenizer", &d.tokenizer,
             "what made the shards; auto reads their ptrain-tokenizer.json"),
      text("data.vocab", &d.vocab,
           "BPE tokenizers: the vocabulary file the shards were made with (data prepare --vocab); null = the default one",
           Empty::kNull),
      number("data.synthetic.vocab", &s.vocab, between(2, kMaxVocab), "tokens used by the corpus"),
      number("data.synthetic.order", &s.order, at_least(1), "Markov chain order"),
      number("data.synthetic.branching", &s.branching, at_least(1),
             "possible next tokens per context"),
      number("data.synthetic.tokens", &s.tokens, at_least(1000), "corpus size in tokens"),
      number("data.synthetic.seed", &s.seed, Range{}, "corpus seed"),
      number("data.synthetic.val_fraction", &s.val_fraction, between(0, 1, true, true),
             "share of the corpus held out for validation"),

      number("training.steps", &t.steps, at_least(1), "optimizer steps"),
      number("training.batch_tokens", &t.batch_tokens, at_least(1),
             "tokens per step; a multiple of micro_batch * seq_len"),
      number("training.micro_batch", &t.micro_batch, at_least(1), "sequences per forward pass"),
      number("training.seq_len", &t.seq_len, at_least(0),
             "training sequence length; 0 = model.seq_len"),
      number("training.grad_clip", &t.grad_clip, at_least(0), "max global grad norm; 0 = off"),
      number("training.eval_every", &t.eval_every, at_least(0),
             "steps between evaluations; 0 = only at the end"),
      number("training.eval_batches", &t.eval_batches, at_least(1), "micro-batches per eval"),
      number("training.threads", &t.threads, at_least(0), "CPU threads; 0 = all available"),
      number("training.loss_weight", &t.loss_weight, above(0),
             "multiplies the loss and so every gradient (the logged loss is unweighted)"),
      flag("training.cuda_graph", &t.cuda_graph,
           "GPU: replay each micro-batch's forward and backward as one recorded CUDA graph"),
      choice("training.recompute", &t.recompute,
             "activations the backward pass recomputes instead of keeping: none, the MLP's hidden ones, or whole "
             "blocks (only their outputs kept)"),
      choice("training.guard.action", &t.guard.action,
             "what a non-finite loss (or a spike) does: stop the run (exit 4), skip that step's update, or roll "
             "back to the newest checkpoint before it and go on in bf16"),
      number("training.guard.spike_zscore", &t.guard.spike_zscore, at_least(0),
             "a loss this many standard deviations above the recent mean is a spike; 0 = spikes not watched"),
      number("training.guard.window", &t.guard.window, between(2, 65536), "recent losses a spike is measured against"),
      number("training.guard.spike_steps", &t.guard.spike_steps, at_least(1),
             "consecutive spiking steps before the guard acts"),
      number("training.guard.max_skips", &t.guard.max_skips, at_least(1),
             "skip: this many skipped updates in a row stop the run (exit 4)"),
      number("training.guard.fallback_steps", &t.guard.fallback_steps, at_least(0),
             "rollback: steps trained in bf16 from the checkpoint on; 0 = the rest of the run"),

      number("optimizer.lr", &o.lr, between(0, 100, true), "peak learning rate"),
      number("optimizer.beta1", &o.beta1, between(0, 1, false, true), "AdamW beta1"),
      number("optimizer.beta2", &o.beta2, between(0, 1, false, true), "AdamW beta2"),
      number("optimizer.eps", &o.eps, between(0, 1, true), "AdamW epsilon"),
      number("optimizer.weight_decay", &o.weight_decay, between(0, 100), "decoupled weight decay"),

      number("schedule.warmup_steps", &sc.warmup_steps, at_least(0), "linear warmup steps"),
      choice("schedule.decay", &sc.decay,
             "learning-rate decay after warmup"),
      number("schedule.min_lr_ratio", &sc.min_lr_ratio, between(0, 1), "final lr / peak lr"),
      number("schedule.wsd_decay_fraction", &sc.wsd_decay_fraction, between(0, 1, true, false),
             "wsd: share of the steps spent decaying at the end"),

      choice("precision.mode", &p.mode, "training precision"),
      flag("precision.tf32", &p.tf32, "TF32 tensor cores for fp32 GEMMs"),
      choice("precision.fp8.recipe", &f8.recipe,
             "FP8 scaling recipe"),
      choice("precision.fp8.format", &f8.format,
             "hybrid: e4m3 forward, e5m2 gradients"),
      number("precision.fp8.margin", &f8.margin, between(0, 32), "scale = fp8_max / amax / 2^margin"),
      number("precision.fp8.amax_history", &f8.amax_history, between(1, 1024),
             "delayed scaling: amax history length"),
      choice("precision.fp8.amax_algo", &f8.amax_algo,
             "delayed scaling: amax from the history"),
      flag("precision.fp8.bf16_first_last", &f8.bf16_first_last,
           "keep the first and last blocks in BF16"),
      flag("precision.fp8.bf16_lm_head", &f8.bf16_lm_head, "keep the LM head in BF16"),
      flag("precision.fp8.primary_weights", &f8.primary_weights,
           "the block linears' working weights kept only as FP8 codes, cast from the FP32 master"),
      flag("precision.fp8.mlp_input_codes", &f8.mlp_input_codes,
           "the MLP's pre-activation kept for the backward pass as FP8 codes (1x128 tiles), not bf16"),
      number("precision.fp8.block_size", &f8.block_size, at_least(1),
             "block recipe: 1 x block_size tiles, block_size^2 weight blocks (128 only)"),
      choice("precision.loss_scaling.mode", &ls.mode,
             "auto = dynamic for fp16, off otherwise"),
      number("precision.loss_scaling.init", &ls.init, between(0, 0x1p64, true), "initial loss scale"),
      number("precision.loss_scaling.growth_factor", &ls.growth_factor, between(1, 1024, true),
             "scale multiplier after growth_interval clean steps"),
      number("precision.loss_scaling.backoff_factor", &ls.backoff_factor, between(0, 1, true, true),
             "scale multiplier after an overflow"),
      number("precision.loss_scaling.growth_interval", &ls.growth_interval, at_least(1),
             "clean steps before growing the scale"),
      number("precision.loss_scaling.hysteresis", &ls.hysteresis, at_least(1),
             "overflows tolerated before backing off"),
      number("precision.loss_scaling.min_scale", &ls.min_scale, between(0, 0x1p64, true), "lowest loss scale"),

      number("checkpoint.every", &ck.every, at_least(0), "steps between checkpoints; 0 = none"),
      number("checkpoint.keep_last", &ck.keep_last, at_least(1), "checkpoints kept on disk"),
      text("checkpoint.resume", &ck.resume, "never, auto (latest checkpoint) or a path"),
      text("checkpoint.dir", &ck.dir, "null = <run dir>/checkpoints", Empty::kNull),
      flag("checkpoint.save_final", &ck.save_final, "save a checkpoint after the last step"),
      choice("checkpoint.on_save_error", &ck.on_save_error,
             "a failed save (full disk): stop the run (exit 1) or warn and train on"),

      number("logging.every", &c.logging.every, at_least(1), "steps between log lines"),
      number("logging.numerics_every", &c.logging.numerics_every, at_least(1),
             "steps between numerics telemetry records"),
      number("logging.sample_every", &c.logging.sample_every, at_least(0),
             "steps between samples printed with the data's tokenizer; 0 = none"),
      number("logging.sample_tokens", &c.logging.sample_tokens, between(1, 4096), "tokens per sample"),
      number("logging.sample_temperature", &c.logging.sample_temperature, between(0, 100),
             "the samples' temperature; 0 = greedy (always the most likely token)"),
      text("logging.sample_prompt", &c.logging.sample_prompt, "text the samples continue; \"\" = a document's start"),

      // ZeRO stages: 0 to 3 (what 3 runs with is checked in validate()).
      number("distributed.zero_stage", &c.distributed.zero_stage, between(0, 3),
             "ZeRO optimizer sharding stage"),
      choice("distributed.grad_reduce_dtype", &c.distributed.grad_reduce_dtype,
             "what the gradients travel between ranks as: fp32, or bf16 (half the bytes: each rank's rounded to "
             "bf16, summed in bf16)"),
  };
  schema.presence = {{"data.synthetic", &d.synthetic_enabled}};
  return schema;
}

// ---- Small text helpers -----------------------------------------------------------------------

std::string parent(const std::string& key) {
  const auto dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string last_segment(const std::string& key) { return key.substr(key.rfind('.') + 1); }

std::vector<std::string> split(const std::string& key) {
  std::vector<std::string> parts;
  std::stringstream in(key);
  for (std::string part; std::getline(in, part, '.');) parts.push_back(part);
  return parts;
}

std::string join(const std::vector<std::string>& items, const std::string& sep) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : sep) + item;
  return out;
}

// Shortest text that reads back as exactly `v` (config.yaml must round trip bit for bit).
std::string format_double(double v) {
  char buf[32];
  // Whole numbers as integers: %g would write 1000 as "1e+03".
  if (v == std::trunc(v) && std::fabs(v) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
    return buf;
  }
  for (int digits = 1; digits <= std::numeric_limits<double>::max_digits10; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above_cell = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = above_cell;
    }
  }
  return row[b.size()];
}

std::string describe(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Null:
      return "null";
    default:
      return node.Tag() == "!" ? "\"" + node.Scalar() + "\"" : node.Scalar();
  }
}

bool in_range(const Range& r, double v) {
  const bool lo_ok = r.lo_open ? v > r.lo : v >= r.lo;
  const bool hi_ok = r.hi_open ? v < r.hi : v <= r.hi;
  return lo_ok && hi_ok;  // false for NaN
}

std::string range_text(const Range& r) {
  const bool has_lo = std::isfinite(r.lo), has_hi = std::isfinite(r.hi);
  if (has_lo && has_hi)
    return std::string(" in ") + (r.lo_open ? "(" : "[") + format_double(r.lo) + ", " +
           format_double(r.hi) + (r.hi_open ? ")" : "]");
  if (has_lo) return (r.lo_open ? " > " : " >= ") + format_double(r.lo);
  if (has_hi) return (r.hi_open ? " < " : " <= ") + format_double(r.hi);
  return "";
}

std::string expected_value(const Field& f) {
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          return "one of " + join(f.choices, ", ");
        } else if constexpr (std::is_same_v<T, bool>) {
          return "true or false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return f.empty == Empty::kString ? "a string" : "a string or null";
        } else {
          return (std::is_integral_v<T> ? "an integer" : "a number") + range_text(f.range);
        }
      },
      f.target);
}

// Stores `node` into the field's member; returns what was wrong, or "" when it was stored.
// Invalid values are not stored, so later checks only ever see valid ones.
std::string assign(const Field& f, const YAML::Node& node) {
  auto* text_member = std::get_if<std::string*>(&f.target);
  if (node.IsNull()) {
    if (text_member && f.empty != Empty::kString) {
      (*text_member)->clear();
      return "";
    }
    return "got null";
  }
  if (!node.IsScalar()) return "got " + describe(node);
  const std::string& value = node.Scalar();
  // yaml-cpp tags quoted scalars "!": those are strings, never numbers or booleans.
  const bool quoted = node.Tag() == "!";
  return std::visit(
      [&](auto member) -> std::string {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          const auto at = std::find(f.choices.begin(), f.choices.end(), value);
          if (at == f.choices.end()) return describe(node) + " is not a valid choice";
          member.set(static_cast<size_t>(at - f.choices.begin()));
        } else if constexpr (std::is_same_v<T, std::string>) {
          // A path or name holding NUL would be cut short by the system (another file read,
          // a message cut off): no text key may hold one.
          if (value.find('\0') != std::string::npos) return "a text with a NUL byte (\\0) in it";
          *member = value;
        } else if (quoted) {
          return describe(node) + " is a quoted string";
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!YAML::convert<bool>::decode(node, *member)) return value + " is not true or false";
        } else if constexpr (std::is_integral_v<T>) {
          int64_t v = 0;
          if (!YAML::convert<int64_t>::decode(node, v)) return value + " is not an integer";
          if (!in_range(f.range, static_cast<double>(v)) || v < std::numeric_limits<T>::min() ||
              v > std::numeric_limits<T>::max())
            return value + " is out of range";
          *member = static_cast<T>(v);
        } else {
          double v = 0;
          if (!YAML::convert<double>::decode(node, v)) return value + " is not a number";
          if (!std::isfinite(v) || !in_range(f.range, v)) return value + " is out of range";
          *member = v;
        }
        return "";
      },
      f.target);
}

// "a" when value is below the first multiple of m, else "a or b" (the multiples around value).
std::string nearest_multiples(int64_t value, int64_t m) {
  const int64_t below = value / m * m;
  if (below == 0) return std::to_string(m);
  return std::to_string(below) + " or " + std::to_string(below + m);
}

// The model keys only model.arch: llama reads.
// precision.schedule and data.sources are lists, read by the Loader itself rather than through
// the schema.
constexpr const char* kScheduleKey = "precision.schedule";
constexpr const char* kSourcesKey = "data.sources";
const char* const kSourcesExpected =
    "a list of maps {train: GLOB, weight: W}, e.g. [{train: \"web/train_*.bin\", weight: 0.7}, "
    "{train: \"code/train_*.bin\", weight: 0.3}]";
const char* const kPhaseExpected =
    "a list of phases, each a map of mode (bf16 or fp8), optionally fp8 (a map of precision.fp8's keys) and, "
    "in all but the last, until_step or until_fraction";

constexpr const char* kLlamaSettings[] = {"model.n_kv_head", "model.rope_theta", "model.norm_eps", "model.mlp_hidden",
                                          "model.mlp_multiple_of", "model.qk_norm"};
bool is_llama_setting(const std::string& key) {
  for (const char* k : kLlamaSettings)
    if (key == k) return true;
  return false;
}

// The divisors of n next to value: "a or b", or one of them at the ends.
std::string nearest_divisors(int64_t n, int64_t value) {
  int64_t below = 0, above = 0;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) {
      if (d <= value) below = d;
      if (d >= value && above == 0) above = d;
    }
  if (below == 0) return std::to_string(above);
  if (above == 0 || above == below) return std::to_string(below);
  return std::to_string(below) + " or " + std::to_string(above);
}

// ---- Loading ----------------------------------------------------------------------------------

// yaml-cpp parses nested collections by recursion without a limit, so a hostile file could
// exhaust the stack. A config is at most a few levels deep: refuse deep nesting before parsing.
// The depth is counted as YAML nests: block levels by the distinct indentation columns open (and
// "- " / "? " indicators, each a level), flow collections by their brackets where they are
// indicators, not inside quoted, plain or block scalars (a key indented 140 spaces, a block
// scalar's text or 40 "[" inside a string are one level each, or none).
constexpr int kMaxFlowDepth = 32;
constexpr int kMaxBlockDepth = 128;
constexpr int kMaxAnyBrackets = 256;  // the backstop: brackets nested anywhere, strings included

std::string nesting_problem(const std::string& text) {
  // A backstop no gap in the lexing below can get past: brackets nested this deep even counting
  // those inside strings and comments is beyond any config.
  int any = 0;
  for (const char ch : text) {
    if ((ch == '[' || ch == '{') && ++any > kMaxAnyBrackets)
      return "nests [ ] or { } more than " + std::to_string(kMaxAnyBrackets) + " levels deep (strings included)";
    if ((ch == ']' || ch == '}') && any > 0) --any;
  }
  std::vector<size_t> columns;    // the block levels open, by indentation column
  int flow = 0;                   // flow collections open (they may span lines)
  char quote = 0;                 // the quoted scalar open, if any (it may span lines)
  long scalar_parent = -1;        // inside a block scalar: its parent's indentation
  std::istringstream in(text);
  int line_number = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_number;
    const auto where = [&] { return "line " + std::to_string(line_number); };
    size_t i = line.find_first_not_of(" \t\r");
    if (i == std::string::npos) continue;  // blank lines belong to whatever is open
    if (scalar_parent >= 0) {
      if (static_cast<long>(i) > scalar_parent) continue;  // the block scalar's text
      scalar_parent = -1;
    }
    long indent = static_cast<long>(i);
    const auto separator = [&](size_t at) { return at >= line.size() || line[at] == ' ' || line[at] == '\t' || line[at] == '\r'; };
    if (flow == 0 && quote == 0) {
      if (line[i] == '#') continue;
      // A document marker with content after it ("--- [a]"): the content starts a value.
      if (i == 0 && (line.rfind("---", 0) == 0 || line.rfind("...", 0) == 0) && separator(3)) {
        columns.clear();
        i = line.find_first_not_of(" \t\r", 3);
        if (i == std::string::npos) continue;
      }
      // The line's indentation, then each "- " or "? " indicator, opens a level at its column.
      for (;;) {
        while (!columns.empty() && columns.back() > i) columns.pop_back();
        if (columns.empty() || columns.back() < i) columns.push_back(i);
        if (columns.size() > static_cast<size_t>(kMaxBlockDepth))
          return where() + " is nested more than " + std::to_string(kMaxBlockDepth) +
                 " levels deep (indentation and list markers)";
        const bool indicator = (line[i] == '-' || line[i] == '?') && separator(i + 1);
        if (!indicator) break;
        indent = static_cast<long>(i);
        i = line.find_first_not_of(" \t\r", i + 1);
        if (i == std::string::npos) break;
      }
      if (i == std::string::npos) continue;
    }
    // The rest of the line: values, keys, flow indicators and comments.
    bool value_start = quote == 0;  // where a value may begin: a bracket or quote here is an indicator
    for (; i < line.size(); ++i) {
      const char ch = line[i];
      if (quote == '"') {
        if (ch == '\\') ++i;
        else if (ch == '"') quote = 0;
        continue;
      }
      if (quote == '\'') {
        if (ch == '\'' && i + 1 < line.size() && line[i + 1] == '\'') ++i;  // '' is a quote inside
        else if (ch == '\'') quote = 0;
        continue;
      }
      if (ch == ' ' || ch == '\t') continue;
      if (ch == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) break;  // a comment
      if (value_start && (ch == '&' || ch == '!')) {  // an anchor or tag: the value follows it
        while (i + 1 < line.size() && !separator(i + 1)) ++i;
        continue;
      }
      if (value_start && (ch == '"' || ch == '\'')) {
        quote = ch;
        value_start = false;
        continue;
      }
      if ((value_start || flow > 0) && (ch == '[' || ch == '{')) {
        if (++flow > kMaxFlowDepth)
          return where() + " nests [ ] or { } more than " + std::to_string(kMaxFlowDepth) + " levels deep";
        value_start = true;
        continue;
      }
      if (flow > 0 && (ch == ']' || ch == '}')) {
        --flow;
        continue;
      }
      if (flow > 0 && ch == ',') {
        value_start = true;
        continue;
      }
      if (ch == ':' && (i + 1 == line.size() || line[i + 1] == ' ' || line[i + 1] == '\t' || flow > 0)) {
        value_start = true;
        continue;
      }
      if (flow == 0 && value_start && (ch == '|' || ch == '>')) {
        // A block scalar: its header (indentation and chomping indicators, a comment) ends the
        // line, and the lines indented past this one are its text.
        const size_t end = line.find_first_not_of("0123456789+-", i + 1);
        if (end == std::string::npos || line[end] == ' ' || line[end] == '\t' || line[end] == '\r') {
          scalar_parent = indent;
          break;
        }
      }
      // A plain scalar runs to ": ", " #" or, in a flow collection, to the next indicator.
      value_start = false;
      if (flow == 0) {
        while (i + 1 < line.size() && !(line[i + 1] == ':' && separator(i + 2)) &&
               !(line[i + 1] == '#' && line[i] == ' '))
          ++i;
      } else {
        while (i + 1 < line.size() && std::string(",[]{}:#").find(line[i + 1]) == std::string::npos) ++i;
      }
    }
  }
  return "";
}

// Whether `text` holds a second YAML document: content after a "---" or "..." marker line that
// follows content. Directives (%YAML) and a closing "..." are not content. (yaml-cpp's LoadAll
// would tell, but Debian's 0.7 loops forever on some invalid input, e.g. "{},"; its Load, used
// here, stops after the first document.)
bool has_second_document(const std::string& text) {
  bool content = false, marker_after_content = false;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const bool marker = (line.rfind("---", 0) == 0 || line.rfind("...", 0) == 0) &&
                        (line.size() == 3 || line[3] == ' ' || line[3] == '\t' || line[3] == '\r');
    const size_t first = line.find_first_not_of(" \t\r");
    // "--- value" starts a document with content on the marker's own line.
    const std::string rest = marker ? line.substr(3) : line;
    const size_t rest_first = rest.find_first_not_of(" \t\r");
    const bool has_content = marker ? rest_first != std::string::npos && rest[rest_first] != '#'
                                    : first != std::string::npos && line[first] != '#' && line[first] != '%';
    if (marker && content) marker_after_content = true;
    if (has_content) {
      if (marker_after_content) return true;
      content = true;
    }
  }
  return false;
}

// One YAML document, parsed after the nesting check. Throws YAML::Exception on bad syntax, and
// returns the problem (deep nesting, a second document) in `problem` instead of a node.
YAML::Node load_one_document(const std::string& text, std::string* problem) {
  *problem = nesting_problem(text);
  if (!problem->empty()) return YAML::Node();
  if (has_second_document(text)) {
    *problem = "holds more than one YAML document (a --- or ... line after the first)";
    return YAML::Node();
  }
  return YAML::Load(text);
}

// Where a key came from: a file position, or a --set flag (no position).
struct Location {
  std::string origin;
  int line = 0;  // 1-based; 0 = no position
  int column = 0;

  std::string text() const {
    return line > 0 ? origin + ":" + std::to_string(line) + ":" + std::to_string(column) : origin;
  }
};

// A YAML document being applied: the file, or the value of one --set flag.
struct Source {
  std::string origin;
  bool positions;  // a --set value's own line:column would mean nothing to the user

  Location at(const YAML::Mark& mark) const {
    if (!positions || mark.is_null()) return {origin};
    return {origin, mark.line + 1, mark.column + 1};
  }
};

class Loader {
 public:
  Loader(Config& config, std::string origin)
      : config_(config), schema_(make_schema(config)), origin_(std::move(origin)) {
    for (size_t i = 0; i < schema_.fields.size(); ++i) {
      const std::string& key = schema_.fields[i].key;
      index_[key] = i;
      for (std::string p = parent(key); !p.empty(); p = parent(p)) sections_.insert(p);
    }
  }

  // Returns false when the text holds no config map at all (then nothing else can be checked).
  bool load_text(const std::string& yaml_text) {
    const Source source{origin_, true};
    // UTF-8 text only: yaml-cpp would take a NUL-holding file for UTF-16 or UTF-32 and show its
    // bytes as text of that encoding.
    const size_t nul = yaml_text.find('\0');  // npos == kValidUtf8: the larger of any offset
    const size_t invalid = std::min(nul, first_invalid_utf8(yaml_text));
    if (invalid != kValidUtf8) {
      problems_.push_back(origin_ + ": the file has " + (invalid == nul ? "a NUL byte" : "a byte that is not UTF-8") +
                          " at byte " + std::to_string(invalid) + " (a binary file, or text in another encoding such as "
                          "UTF-16); expected a YAML text file in UTF-8");
      return false;
    }
    YAML::Node root;
    std::string refused;
    try {
      root = load_one_document(yaml_text, &refused);
    } catch (const YAML::Exception& e) {
      problems_.push_back(source.at(e.mark).text() + ": malformed YAML: " + e.msg +
                          "; expected valid YAML syntax");
      return false;
    }
    if (!refused.empty()) {
      problems_.push_back(origin_ + ": the file " + refused + "; expected one YAML document, a run config");
      return false;
    }
    walk(root, "", source.at(root.Mark()), source);
    // Without a map at the top nothing was read: cross-key checks would only add noise.
    return root.IsNull() || root.IsMap();
  }

  void apply_override(const std::string& flag_text) {
    const Source source{"--set " + flag_text, false};
    const Location location{source.origin};
    const auto eq = flag_text.find('=');
    if (eq == std::string::npos || eq == 0) {
      problem(location, flag_text, "not of the form key=value",
              "section.key=value, e.g. model.n_layer=4");
      return;
    }
    const std::string key = flag_text.substr(0, eq);
    YAML::Node value;
    std::string refused;
    try {
      value = load_one_document(flag_text.substr(eq + 1), &refused);
    } catch (const YAML::Exception& e) {
      const auto field = index_.find(key);
      problem(
          location, key, "the value is not valid YAML (" + e.msg + ")",
          field == index_.end() ? "a YAML value" : expected_value(schema_.fields[field->second]));
      return;
    }
    if (!refused.empty()) {
      problem(location, key, "the value " + refused, "one YAML value");
      return;
    }
    // `--set key=null` removes the key (or section): it is then as if never given.
    if (value.IsNull() && (index_.count(key) || sections_.count(key))) {
      remove(key);
      return;
    }
    visit(key, value, location, source);
  }

  // Checks that involve several keys, required keys, and features this build lacks.
  void validate() {
    const Config& c = config_;
    for (const Field& f : schema_.fields)
      if (f.required && !seen_.count(f.key) && !rejected(f.key))
        problem(where({f.key}), f.key, "required, no default", expected_value(f));
    resolve_schedule();

    // The run directory is <out_dir>/<name>: a name that is a path could land anywhere.
    const std::string& name = c.run.name;
    // A control character (a newline) would also forge lines in log.txt, which names the run.
    const bool control = std::any_of(name.begin(), name.end(), [](char ch) {
      return static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f;
    });
    if (usable({"run.name"}) &&
        (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos || control))
      problem(where({"run.name"}), "run.name",
              (control ? std::string("a name with a control character (a newline, a tab)")
                       : "\"" + name + "\" is not a plain directory name"),
              "a non-empty name without '/' or control characters (not . or ..); put the parent folder in "
              "run.out_dir");

    if (usable({"data.train", "data.val"}) && !rejected(kSourcesKey)) {
      // data.sources stands for data.train: a blend of globs instead of one.
      const bool sources = !c.data.sources.empty();
      const bool train = !c.data.train.empty() || sources, val = !c.data.val.empty();
      const std::string train_key = sources ? kSourcesKey : "data.train";
      const std::string either = "either data.synthetic, or data.val with data.train or data.sources";
      if (sources && !c.data.train.empty()) {
        problem(where({kSourcesKey}), kSourcesKey, "given beside data.train",
                "one of data.train (one glob) and data.sources (a weighted blend of globs)");
      } else if (c.data.synthetic_enabled && (train || val)) {
        const std::string key = train ? train_key : "data.val";
        problem(where({key}), key, "cannot be combined with data.synthetic", either);
      } else if (!c.data.synthetic_enabled && !train && !val) {
        problem(where({"data"}), "data", "no training data given", either);
      } else if (train != val) {
        const std::string given = train ? train_key : "data.val";
        const std::string missing = train ? "data.val" : "data.train";
        problem(where({given}), missing, "missing while " + given + " is set",
                "data.val and data.train (globs of token shards), or data.val and data.sources");
      }
    }

    const ModelConfig& m = c.model;
    if (usable({"model.n_embd", "model.n_head"}) && m.n_embd % m.n_head != 0)
      problem(where({"model.n_embd", "model.n_head"}), "model.n_embd",
              std::to_string(m.n_embd) +
                  " is not divisible by model.n_head = " + std::to_string(m.n_head),
              "a multiple of model.n_head, e.g. " + nearest_multiples(m.n_embd, m.n_head));

    check_architecture(c);

    const TrainingConfig& t = c.training;
    if (usable({"training.seq_len", "model.seq_len"}) && t.seq_len > m.seq_len)
      problem(where({"training.seq_len"}), "training.seq_len",
              std::to_string(t.seq_len) +
                  " is above the model's context model.seq_len = " + std::to_string(m.seq_len),
              "at most " + std::to_string(m.seq_len) + ", or 0 for the model's context");

    if (usable({"training.batch_tokens", "training.micro_batch", "training.seq_len",
                "model.seq_len"})) {
      const int64_t seq = t.effective_seq_len(m);
      const int64_t per_micro_batch = int64_t{t.micro_batch} * seq;
      if (t.batch_tokens % per_micro_batch != 0)
        problem(where({"training.batch_tokens", "training.micro_batch", "training.seq_len",
                       "model.seq_len"}),
                "training.batch_tokens",
                std::to_string(t.batch_tokens) +
                    " is not a multiple of training.micro_batch * seq_len = " +
                    std::to_string(t.micro_batch) + " * " + std::to_string(seq) + " = " +
                    std::to_string(per_micro_batch),
                "a multiple of " + std::to_string(per_micro_batch) + ", e.g. " +
                    nearest_multiples(t.batch_tokens, per_micro_batch));
    }

    if (usable({"data.vocab", "data.tokenizer"}) && !c.data.vocab.empty() && c.data.tokenizer == TokenizerChoice::bytes)
      problem(where({"data.vocab", "data.tokenizer"}), "data.vocab",
              c.data.vocab + " with data.tokenizer: bytes, which has no vocabulary file", "null, or a BPE data.tokenizer");
    const SyntheticDataConfig& s = c.data.synthetic;
    if (c.data.synthetic_enabled) {
      if (usable({"data.tokenizer"}) && c.data.tokenizer != TokenizerChoice::auto_)
        problem(where({"data.tokenizer"}), "data.tokenizer",
                std::string(choice_name(c.data.tokenizer)) + " with data.synthetic, whose tokens are no tokenizer's",
                "auto");
      if (usable({"data.vocab"}) && !c.data.vocab.empty())
        problem(where({"data.vocab"}), "data.vocab", c.data.vocab + " with data.synthetic, whose tokens are no tokenizer's",
                "null");
      if (usable({"data.synthetic.vocab", "model.vocab_size"}) && s.vocab > m.vocab_size)
        problem(where({"data.synthetic.vocab", "model.vocab_size"}), "data.synthetic.vocab",
                std::to_string(s.vocab) +
                    " is above model.vocab_size = " + std::to_string(m.vocab_size),
                "at most " + std::to_string(m.vocab_size));
      if (usable({"data.synthetic.branching", "data.synthetic.vocab"}) && s.branching > s.vocab)
        problem(where({"data.synthetic.branching", "data.synthetic.vocab"}),
                "data.synthetic.branching",
                std::to_string(s.branching) +
                    " is above data.synthetic.vocab = " + std::to_string(s.vocab),
                "at most " + std::to_string(s.vocab));
    }

    // FP8 GEMMs need 16-element-aligned dimensions (cuBLASLt's FP8 rule, kept on every backend
    // so a config that trains on the CPU also trains on a GPU); block scaling needs whole
    // 128-wide blocks.
    const Fp8Config& f8 = c.precision.fp8;
    const std::optional<Fp8Recipe> recipe = strictest_fp8_recipe(c.precision);
    if (recipe && usable({"precision.mode", "model.n_embd", "precision.fp8.recipe"})) {
      const int multiple = fp8_dimension_multiple(*recipe);
      const std::string needs = fp8_needs(c.precision, *recipe);
      if (m.n_embd % multiple != 0)
        problem(where({"model.n_embd", "precision.mode"}), "model.n_embd",
                std::to_string(m.n_embd) + " is not a multiple of " + std::to_string(multiple) + needs,
                "a multiple of " + std::to_string(multiple) + ", e.g. " + nearest_multiples(m.n_embd, multiple));
      // The weight-gradient GEMM contracts over the micro-batch's tokens.
      if (usable({"training.micro_batch", "training.seq_len", "model.seq_len"})) {
        const int64_t tokens = int64_t{t.micro_batch} * t.effective_seq_len(m);
        if (tokens % multiple != 0)
          problem(where({"training.micro_batch", "precision.mode"}), "training.micro_batch",
                  "micro_batch * seq_len = " + std::to_string(tokens) + " is not a multiple of " +
                      std::to_string(multiple) + needs + " (the weight-gradient GEMM runs over these tokens)",
                  "micro_batch * seq_len a multiple of " + std::to_string(multiple));
      }
    }
    if (usable({"precision.fp8.block_size"}) && f8.block_size != 128)
      problem(where({"precision.fp8.block_size"}), "precision.fp8.block_size",
              std::to_string(f8.block_size) + " is not a supported block size", "128 (1x128 tiles, 128x128 weight blocks)");

    check_rollback(c);
    check_primary_weights(c);
    check_mlp_input_codes(c);

    // A precision schedule makes new FP8 layers at its switches: not tried with the weights
    // sharded (ZeRO-3), so refused rather than run untested.
    if (usable({"distributed.zero_stage"}) && c.distributed.zero_stage == 3 && !c.precision.schedule.empty() &&
        !rejected(kScheduleKey))
      problem(where({"distributed.zero_stage", kScheduleKey}), "distributed.zero_stage",
              "3 with a precision.schedule: switching precision with sharded parameters is not implemented",
              "one precision.mode, or distributed.zero_stage 2");
  }

  // training.guard.action rollback reloads a checkpoint and goes on in bf16, switched in place as
  // a precision schedule switches: it needs checkpoints, FP8 to fall back from, and the whole
  // master weights on each rank.
  void check_rollback(const Config& c) {
    const GuardConfig& g = c.training.guard;
    if (!usable({"training.guard.action"}) || g.action != GuardAction::rollback) return;
    if (usable({"checkpoint.every"}) && c.checkpoint.every == 0)
      problem(where({"checkpoint.every", "training.guard.action"}), "checkpoint.every",
              "0 with training.guard.action rollback, which reloads the newest checkpoint before the divergence",
              "checkpoint.every > 0, e.g. 100");
    if (usable({"precision.mode"}) && !strictest_fp8_recipe(c.precision))
      problem(where({"precision.mode", "training.guard.action"}), "training.guard.action",
              "rollback with precision " +
                  std::string(c.precision.schedule.empty() ? choice_name(c.precision.mode) : "bf16 throughout") +
                  ": a rollback goes on in bf16, switched in place (as precision.schedule does), which needs a run in "
                  "fp8 (or a schedule with an fp8 phase)",
              "stop or skip, or precision.mode fp8");
    if (usable({"distributed.zero_stage"}) && c.distributed.zero_stage >= 1)
      problem(where({"distributed.zero_stage", "training.guard.action"}), "training.guard.action",
              "rollback with distributed.zero_stage " + std::to_string(c.distributed.zero_stage) +
                  ", whose ranks do not keep the whole master weights a rollback reloads (not implemented)",
              "stop or skip, or distributed.zero_stage 0");
  }

  // precision.fp8.primary_weights: the block linears keep no bf16 copy of their weights, their
  // FP8 codes are cast from the FP32 master.
  void check_primary_weights(const Config& c) {
    check_fp8_throughout(c, "precision.fp8.primary_weights", &Fp8Config::primary_weights, "would have no bf16 weights");
  }

  // precision.fp8.mlp_input_codes: the MLP's pre-activation is kept as FP8 codes in place of its
  // bf16 values, and saves only where every layer's is kept (recompute: mlp and block keep one
  // layer's bf16 room already).
  void check_mlp_input_codes(const Config& c) {
    const std::string key = "precision.fp8.mlp_input_codes";
    if (!check_fp8_throughout(c, key, &Fp8Config::mlp_input_codes, "keep their MLP input in bf16")) return;
    if (usable({"training.recompute"}) && c.training.recompute != Recompute::none)
      problem(where({"training.recompute", key}), key,
              std::string("true with training.recompute ") + choice_name(c.training.recompute) +
                  ", which keeps one layer's MLP input only (nothing to save)",
              "false, or training.recompute none");
  }

  // A precision.fp8 key (`flag`) that changes what FP8 blocks keep, so that every block must
  // run in FP8 for the whole run: refused by name beside whatever runs a block in bf16 (a
  // precision.schedule, whose switches remake the FP8 layers; another mode; bf16 first and last
  // blocks; the guard's rollback), whose bf16 blocks `bf16_blocks` (what they would lack). Says
  // whether the key was asked for and is usable.
  bool check_fp8_throughout(const Config& c, const std::string& key, bool Fp8Config::*flag,
                            const std::string& bf16_blocks) {
    const PrecisionConfig& p = c.precision;
    bool asked = p.fp8.*flag;
    for (const PrecisionPhase& phase : p.schedule) asked = asked || phase.fp8.*flag;
    if (!asked || !usable({key})) return false;
    if (!p.schedule.empty() && !rejected(kScheduleKey))
      problem(where({kScheduleKey, key}), key,
              "true with precision.schedule, whose switches remake the FP8 layers (a bf16 phase's blocks " +
                  bf16_blocks + ")",
              "false, or no precision.schedule");
    else if (usable({"precision.mode"}) && p.mode != PrecisionMode::fp8)
      problem(where({"precision.mode", key}), key,
              std::string("true with precision.mode ") + choice_name(p.mode) + ", which runs no block in FP8",
              "false, or precision.mode fp8");
    if (usable({"precision.fp8.bf16_first_last"}) && p.fp8.bf16_first_last)
      problem(where({"precision.fp8.bf16_first_last", key}), key,
              "true with precision.fp8.bf16_first_last, whose bf16 blocks " + bf16_blocks,
              "false, or precision.fp8.bf16_first_last false");
    if (usable({"training.guard.action"}) && c.training.guard.action == GuardAction::rollback)
      problem(where({"training.guard.action", key}), key,
              "true with training.guard.action rollback, which goes on in bf16 blocks: they " + bf16_blocks,
              "false, or training.guard.action stop or skip");
    return true;
  }

  // The FP8 recipe whose alignment rules the GEMMs must meet: block (128) when any FP8 phase
  // uses it, else the one FP8 recipe (16); none when nothing runs in FP8.
  static std::optional<Fp8Recipe> strictest_fp8_recipe(const PrecisionConfig& p) {
    if (p.schedule.empty()) return p.mode == PrecisionMode::fp8 ? std::optional(p.fp8.recipe) : std::nullopt;
    std::optional<Fp8Recipe> recipe;
    for (const PrecisionPhase& phase : p.schedule)
      if (phase.mode == PrecisionMode::fp8 && recipe != Fp8Recipe::block) recipe = phase.fp8.recipe;
    return recipe;
  }
  static std::string fp8_needs(const PrecisionConfig& p, Fp8Recipe recipe) {
    return (p.schedule.empty() ? " as precision.mode fp8" : " as precision.schedule's FP8 phases") +
           std::string(recipe == Fp8Recipe::block ? " with recipe block" : "") + (p.schedule.empty() ? " needs" : " need");
  }

  // What model.arch allows: GPT-2's fixed layout, or Llama's settings and what RoPE and GQA need.
  void check_architecture(const Config& c) {
    const ModelConfig& m = c.model;
    if (!usable({"model.arch"})) return;
    if (m.arch == Arch::gpt2) {
      // Llama's keys given with GPT-2 would be silently ignored: say so instead.
      for (const char* key : kLlamaSettings)
        if (seen_.count(key))
          problem(where({key}), key, "is a llama setting, and model.arch is gpt2", "model.arch: llama, or no " +
                                                                                       std::string(key));
      if (usable({"model.tie_embeddings"}) && m.tie_embeddings == TieEmbeddings::no)
        problem(where({"model.tie_embeddings"}), "model.tie_embeddings",
                "false with model.arch gpt2, whose LM head is the token embedding", "auto or true");
      return;
    }
    if (!usable({"model.n_embd", "model.n_head"}) || m.n_embd % m.n_head != 0) return;
    const int hs = m.n_embd / m.n_head;
    if (hs % 2 != 0)
      problem(where({"model.n_embd", "model.n_head"}), "model.n_embd",
              std::to_string(m.n_embd) + " / model.n_head " + std::to_string(m.n_head) + " = " + std::to_string(hs) +
                  " is an odd head size, and RoPE turns pairs of elements",
              "an even head size");
    if (usable({"model.n_kv_head"}) && m.n_head % m.kv_heads() != 0)
      problem(where({"model.n_kv_head", "model.n_head"}), "model.n_kv_head",
              std::to_string(m.n_kv_head) + " does not divide model.n_head = " + std::to_string(m.n_head) +
                  " (each K/V head serves a whole group of query heads)",
              "a divisor of " + std::to_string(m.n_head) + ", e.g. " + nearest_divisors(m.n_head, m.n_kv_head));
    const std::optional<Fp8Recipe> recipe = strictest_fp8_recipe(c.precision);
    if (recipe && usable({"precision.mode", "precision.fp8.recipe", "model.mlp_hidden", "model.mlp_multiple_of"})) {
      // Beyond n_embd (checked with GPT-2's rules), the K/V and SwiGLU widths are GEMM dimensions.
      const int multiple = fp8_dimension_multiple(*recipe);
      const std::string needs = fp8_needs(c.precision, *recipe);
      const int hidden = m.swiglu_hidden();
      if (hidden % multiple != 0)
        problem(where({"model.mlp_hidden", "precision.mode"}), "model.mlp_hidden",
                "the SwiGLU width " + std::to_string(hidden) + " is not a multiple of " + std::to_string(multiple) + needs,
                "a multiple of " + std::to_string(multiple) + ", e.g. " + nearest_multiples(hidden, multiple));
      const int64_t kv_width = int64_t{m.kv_heads()} * hs;
      if (usable({"model.n_kv_head"}) && kv_width % multiple != 0)
        problem(where({"model.n_kv_head", "precision.mode"}), "model.n_kv_head",
                "the K/V width n_kv_head * head_size = " + std::to_string(kv_width) + " is not a multiple of " +
                    std::to_string(multiple) + needs,
                "n_kv_head * head_size a multiple of " + std::to_string(multiple));
    }
  }

  void throw_if_problems() const {
    if (!problems_.empty()) throw UserErrors(problems_);
  }

 private:
  void problem(const Location& location, const std::string& key, const std::string& what,
               const std::string& expected) {
    problems_.push_back(location.text() + ": " + key + ": " + what + "; expected " + expected);
  }

  // Applies a map (or null: an empty section) found at `path` ("" = the top level).
  void walk(const YAML::Node& node, const std::string& path, const Location& location,
            const Source& source) {
    if (node.IsNull()) return;
    if (!node.IsMap()) {
      bad_.insert(path);
      problem(location, path.empty() ? "top level" : path, "got " + describe(node),
              "a map with keys " + children_text(path));
      return;
    }
    std::set<std::string> keys_here;
    for (const auto& entry : node) {
      const Location key_location = source.at(entry.first.Mark());
      if (!entry.first.IsScalar()) {
        problem(key_location, path.empty() ? "top level" : path,
                "a key is " + describe(entry.first), "plain key names");
        continue;
      }
      const std::string key =
          path.empty() ? entry.first.Scalar() : path + "." + entry.first.Scalar();
      if (!keys_here.insert(key).second) {
        problem(key_location, key, "duplicate key", "each key at most once");
        continue;
      }
      visit(key, entry.second, key_location, source);
    }
  }

  void visit(const std::string& key, const YAML::Node& value, const Location& location,
             const Source& source) {
    if (key == kScheduleKey) {
      read_schedule(value, location, source);
    } else if (key == kSourcesKey) {
      read_sources(value, location, source);
    } else if (const auto field = index_.find(key); field != index_.end()) {
      set_field(schema_.fields[field->second], value, location);
    } else if (sections_.count(key)) {
      mark_present(key, location);
      walk(value, key, location, source);
    } else {
      unknown(key, location);
    }
  }

  void set_field(const Field& f, const YAML::Node& value, const Location& location) {
    seen_[f.key] = location;
    mark_present(parent(f.key), location);
    const std::string wrong = assign(f, value);
    if (wrong.empty()) {
      bad_.erase(f.key);
    } else {
      bad_.insert(f.key);
      problem(location, f.key, wrong, expected_value(f));
    }
  }

  // One phase of precision.schedule as given: its keys (fp8's as "fp8.KEY") with their values and
  // where they stand. Values are checked in resolve_schedule(), once precision.fp8, the phases'
  // defaults, is final (an override may come after the file).
  struct GivenValue {
    std::string key;
    YAML::Node value;
    Location location;
  };
  struct GivenPhase {
    Location location;
    std::vector<GivenValue> values;
  };

  // Starts reading a list key given at `location` (an earlier value already forgotten): false
  // for null (no list) or for what is not a non-empty list, reported with `expected`.
  bool start_list(const char* key, const YAML::Node& value, const Location& location, const char* expected) {
    seen_[key] = location;
    mark_present(parent(key), location);
    bad_.erase(key);
    if (value.IsNull()) return false;
    if (value.IsSequence() && value.size() > 0) return true;
    bad_.insert(key);
    problem(location, key, "got " + (value.IsSequence() ? std::string("an empty list") : describe(value)), expected);
    return false;
  }

  // precision.schedule: null (no schedule) or a list of phase maps; replaces any earlier one.
  void read_schedule(const YAML::Node& value, const Location& location, const Source& source) {
    schedule_.clear();
    if (!start_list(kScheduleKey, value, location, kPhaseExpected)) return;
    for (size_t i = 0; i < value.size(); ++i) {
      const YAML::Node node = value[i];
      const std::string name = phase_name(i);
      GivenPhase phase{source.at(node.Mark()), {}};
      if (!node.IsMap()) {
        bad_.insert(kScheduleKey);
        problem(phase.location, name, "got " + describe(node), "a map with keys until_step, until_fraction, mode, fp8");
        continue;
      }
      const auto add = [&](const std::string& key, const YAML::Node& v, const Location& at) {
        for (const GivenValue& earlier : phase.values)
          if (earlier.key == key) {
            bad_.insert(kScheduleKey);
            problem(at, name + "." + key, "duplicate key", "each key at most once");
            return;
          }
        phase.values.push_back({key, v, at});
      };
      for (const auto& entry : node) {
        const Location at = source.at(entry.first.Mark());
        const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
        if (key == "until_step" || key == "until_fraction" || key == "mode") {
          add(key, entry.second, at);
        } else if (key == "fp8" && (entry.second.IsMap() || entry.second.IsNull())) {
          add("fp8", YAML::Node(), at);  // a second fp8 map is a duplicate key
          for (const auto& f : entry.second) {
            const Location f_at = source.at(f.first.Mark());
            if (f.first.IsScalar() && index_.count("precision.fp8." + f.first.Scalar())) {
              add("fp8." + f.first.Scalar(), f.second, f_at);
            } else {
              bad_.insert(kScheduleKey);
              problem(f_at, name + ".fp8" + (f.first.IsScalar() ? "." + f.first.Scalar() : std::string()),
                      f.first.IsScalar() ? "unknown key" : "a key is " + describe(f.first),
                      "a key of precision.fp8: " + children_text("precision.fp8"));
            }
          }
        } else {
          bad_.insert(kScheduleKey);
          problem(at, name + (key.empty() ? std::string() : "." + key),
                  key.empty() ? "a key is " + describe(entry.first) : key == "fp8" ? "got " + describe(entry.second) : "unknown key",
                  key == "fp8" ? "a map of precision.fp8's keys" : "until_step, until_fraction, mode or fp8");
        }
      }
      schedule_.push_back(std::move(phase));
    }
  }

  // data.sources: null (none) or a list of {train, weight} maps; replaces any earlier list.
  void read_sources(const YAML::Node& value, const Location& location, const Source& source) {
    std::vector<DataSource>& sources = config_.data.sources;
    sources.clear();
    if (!start_list(kSourcesKey, value, location, kSourcesExpected)) return;
    for (size_t i = 0; i < value.size(); ++i) {
      const YAML::Node node = value[i];
      const std::string name = std::string(kSourcesKey) + "[" + std::to_string(i + 1) + "]";
      const Location at = source.at(node.Mark());
      DataSource given;
      const Field train = text(name + ".train", &given.train, "");
      const Field weight = number(name + ".weight", &given.weight, at_least(0), "");
      std::set<std::string> keys;
      if (!node.IsMap()) {
        reject_source(at, name, "got " + describe(node), "a map with keys train and weight");
        continue;
      }
      for (const auto& entry : node) {
        const Location key_at = source.at(entry.first.Mark());
        const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : std::string();
        const Field* f = key == "train" ? &train : key == "weight" ? &weight : nullptr;
        if (f == nullptr) {
          reject_source(key_at, name + (key.empty() ? std::string() : "." + key),
                 key.empty() ? "a key is " + describe(entry.first) : "unknown key", "train or weight");
        } else if (!keys.insert(key).second) {
          reject_source(key_at, f->key, "duplicate key", "each key at most once");
        } else if (const std::string wrong = assign(*f, entry.second); !wrong.empty()) {
          reject_source(key_at, f->key, wrong, key == "train" ? "a glob of token shards" : expected_value(*f));
        } else if (key == "train" && given.train.empty()) {
          reject_source(key_at, f->key, "an empty glob", "a glob of token shards");
        }
      }
      for (const Field* f : {&train, &weight})
        if (!keys.count(last_segment(f->key)))
          reject_source(at, f->key, "missing", f == &train ? "a glob of token shards" : "a number >= 0");
      sources.push_back(given);
    }
    double sum = 0;
    for (const DataSource& d : sources) sum += d.weight;
    if (!rejected(kSourcesKey) && !(sum > 0 && std::isfinite(sum)))
      reject_source(location, kSourcesKey, sum > 0 ? "the weights sum past the largest number" : "every weight is 0",
                    "at least one weight above 0, all summing to a finite number (weights are relative)");
  }

  void reject_source(const Location& location, const std::string& key, const std::string& wrong,
                     const std::string& expected) {
    bad_.insert(kSourcesKey);
    problem(location, key, wrong, expected);
  }

  static std::string phase_name(size_t i) { return std::string(kScheduleKey) + "[" + std::to_string(i + 1) + "]"; }

  // Fills config_.precision.schedule from the phases as given and checks them against each other
  // and against training.steps; precision.mode becomes the first phase's.
  void resolve_schedule() {
    Config& c = config_;
    c.precision.schedule.clear();
    if (schedule_.empty() || rejected(kScheduleKey)) return;
    bool complete = true;
    std::vector<PrecisionPhase> phases;
    for (size_t i = 0; i < schedule_.size(); ++i) {
      const std::string name = phase_name(i);
      Config scratch;  // the phase's fp8 keys over precision.fp8, checked as precision.fp8's are
      scratch.precision.fp8 = c.precision.fp8;
      const Schema scratch_schema = make_schema(scratch);
      PrecisionPhase phase;
      for (const GivenValue& v : schedule_[i].values) {
        if (v.key == "fp8") continue;  // its keys follow as fp8.KEY
        Field f = v.key == "until_step"       ? number(name + ".until_step", &phase.until_step, at_least(1), "")
                  : v.key == "until_fraction" ? number(name + ".until_fraction", &phase.until_fraction,
                                                       between(0, 1, true, true), "")
                  : v.key == "mode"           ? choice(name + ".mode", &phase.mode, "", {PrecisionMode::bf16, PrecisionMode::fp8})
                                              : scratch_schema.fields[index_.at("precision." + v.key)];
        f.key = name + "." + v.key;
        const std::string wrong = assign(f, v.value);
        if (wrong.empty()) continue;
        complete = false;
        problem(v.location, f.key, wrong,
                v.key == "mode" ? "bf16 or fp8, the modes that store weights, activations and gradients alike (in "
                                  "bf16), so that a switch keeps every buffer"
                                : expected_value(f));
      }
      phase.fp8 = scratch.precision.fp8;
      const bool own_block_size = std::any_of(schedule_[i].values.begin(), schedule_[i].values.end(),
                                              [](const GivenValue& v) { return v.key == "fp8.block_size"; });
      if (own_block_size && phase.fp8.block_size != 128) {
        complete = false;
        problem(schedule_[i].location, name + ".fp8.block_size",
                std::to_string(phase.fp8.block_size) + " is not a supported block size", "128 (1x128 tiles, 128x128 weight blocks)");
      }
      const bool last = i + 1 == schedule_.size();
      const bool has_step = phase.until_step > 0, has_fraction = phase.until_fraction > 0;
      const bool given_until = std::any_of(schedule_[i].values.begin(), schedule_[i].values.end(),
                                           [](const GivenValue& v) { return v.key.rfind("until_", 0) == 0; });
      if (std::none_of(schedule_[i].values.begin(), schedule_[i].values.end(), [](const GivenValue& v) { return v.key == "mode"; })) {
        complete = false;
        problem(schedule_[i].location, name + ".mode", "missing", "bf16 or fp8");
      }
      if (last && given_until) {
        complete = false;
        const std::string given = std::find_if(schedule_[i].values.begin(), schedule_[i].values.end(), [](const GivenValue& v) {
                                    return v.key.rfind("until_", 0) == 0;
                                  })->key;
        problem(schedule_[i].location, name, "the last phase has an end (" + given + ")",
                "no until_step or until_fraction in the last phase: it runs to training.steps");
      } else if (!last && has_step && has_fraction) {
        complete = false;
        problem(schedule_[i].location, name, "both until_step and until_fraction", "one of them");
      } else if (!last && !given_until) {
        complete = false;
        problem(schedule_[i].location, name, "no end", "until_step (the phase's last step) or until_fraction (of training.steps)");
      }
      phases.push_back(phase);
    }
    if (!complete) return;
    if (usable({"training.steps"})) {
      int64_t previous = 0;
      for (size_t i = 0; i + 1 < phases.size(); ++i) {
        const int64_t end = phase_last_step(phases[i], c.training.steps);
        const std::string name = phase_name(i);
        const std::string at = phases[i].until_step > 0 ? std::to_string(end)
                                                        : std::to_string(end) + " (floor of " + format_double(phases[i].until_fraction) +
                                                              " x training.steps " + std::to_string(c.training.steps) + ")";
        if (end <= previous)
          problem(schedule_[i].location, name,
                  "ends at step " + at + (i == 0 ? std::string(", before step 1")
                                                 : ", not after the phase before it (step " + std::to_string(previous) + ")"),
                  "each phase at least one step long");
        else if (end >= c.training.steps)
          problem(schedule_[i].location, name, "ends at step " + at + ", so the phases after it never run (training.steps is " +
                      std::to_string(c.training.steps) + ")",
                  "a last step below training.steps");
        previous = std::max(previous, end);
      }
    }
    if (seen_.count("precision.mode") && usable({"precision.mode"}) && c.precision.mode != phases.front().mode) {
      problem(where({"precision.mode"}), "precision.mode",
              std::string(choice_name(c.precision.mode)) + ", while precision.schedule starts in " +
                  choice_name(phases.front().mode),
              "precision.mode left out (the schedule sets it; --set precision.mode=null) or the first phase's mode, "
              "or no schedule (--set precision.schedule=null)");
      return;
    }
    c.precision.mode = phases.front().mode;
    c.precision.schedule = std::move(phases);
  }

  // Forgets `key` and everything under it: defaults again, not given, not rejected.
  void remove(const std::string& key) {
    Config defaults;
    const Schema default_schema = make_schema(defaults);
    const auto under = [&](const std::string& k) { return k == key || k.rfind(key + ".", 0) == 0; };
    for (size_t i = 0; i < schema_.fields.size(); ++i)
      if (under(schema_.fields[i].key))
        std::visit(
            [&](auto member) {
              const auto& fallback = std::get<decltype(member)>(default_schema.fields[i].target);
              if constexpr (std::is_same_v<decltype(member), ChoiceRef>)
                member.set(fallback.get());
              else
                *member = *fallback;
            },
            schema_.fields[i].target);
    for (const auto& [section, flag] : schema_.presence)
      if (under(section)) *flag = false;
    if (under(kScheduleKey)) schedule_.clear();
    if (under(kSourcesKey)) config_.data.sources.clear();
    for (auto it = seen_.begin(); it != seen_.end();) it = under(it->first) ? seen_.erase(it) : std::next(it);
    for (auto it = bad_.begin(); it != bad_.end();) it = under(*it) ? bad_.erase(it) : std::next(it);
  }

  // Records `section` and its parents as present (an override may name a key of a section the
  // file lacks, e.g. data.synthetic.vocab).
  void mark_present(const std::string& section, const Location& location) {
    for (std::string p = section; !p.empty(); p = parent(p)) {
      seen_.emplace(p, location);
      if (const auto flag = schema_.presence.find(p); flag != schema_.presence.end())
        *flag->second = true;
    }
  }

  void unknown(const std::string& key, const Location& location) {
    std::string section = parent(key);
    while (!section.empty() && !sections_.count(section)) section = parent(section);
    std::string expected = section.empty() ? "a section: " + children_text("")
                                           : "a key of " + section + ": " + children_text(section);
    const std::string hint = suggestion(key);
    if (!hint.empty()) expected += " (did you mean " + hint + "?)";
    problem(location, key, "unknown key", expected);
  }

  // The closest known key at the same depth (typos), else keys with the same last segment in
  // other sections (a key put in the wrong section).
  std::string suggestion(const std::string& key) const {
    const size_t depth = split(key).size();
    std::string best;
    size_t best_distance = 3;
    auto consider = [&](const std::string& known) {
      if (split(known).size() != depth) return;
      const size_t distance = edit_distance(key, known);
      if (distance < best_distance) best_distance = distance, best = known;
    };
    for (const Field& f : schema_.fields) consider(f.key);
    for (const std::string& s : sections_) consider(s);
    consider(kScheduleKey);
    consider(kSourcesKey);
    if (!best.empty()) return "\"" + best + "\"";
    std::vector<std::string> same_name;
    for (const Field& f : schema_.fields)
      if (last_segment(f.key) == last_segment(key)) same_name.push_back("\"" + f.key + "\"");
    return join(same_name, " or ");
  }

  // The names directly under a section ("" = top level), comma separated, in schema order.
  std::string children_text(const std::string& section) const {
    std::vector<std::string> names;
    for (const Field& f : schema_.fields) {
      if (section.empty() ? false : f.key.compare(0, section.size() + 1, section + ".") != 0)
        continue;
      const std::string rest = section.empty() ? f.key : f.key.substr(section.size() + 1);
      const std::string name = rest.substr(0, rest.find('.'));
      if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    }
    if (section == parent(kScheduleKey)) names.push_back(last_segment(kScheduleKey));
    if (section == parent(kSourcesKey)) names.push_back(last_segment(kSourcesKey));
    return join(names, ", ");
  }

  // The location of the first named key that was given, else of its section, else the file.
  Location where(std::initializer_list<std::string> keys) const {
    for (const auto& key : keys)
      if (const auto it = seen_.find(key); it != seen_.end()) return it->second;
    for (const auto& key : keys)
      for (std::string p = parent(key); !p.empty(); p = parent(p))
        if (const auto it = seen_.find(p); it != seen_.end()) return it->second;
    return {origin_};
  }

  // True when the key's value, or its section, was rejected.
  bool rejected(const std::string& key) const {
    for (std::string p = key; !p.empty(); p = parent(p))
      if (bad_.count(p)) return true;
    return false;
  }

  // True when none of the keys was rejected and every required one was given.
  bool usable(std::initializer_list<std::string> keys) const {
    for (const auto& key : keys) {
      if (rejected(key)) return false;
      if (schema_.fields[index_.at(key)].required && !seen_.count(key)) return false;
    }
    return true;
  }

  Config& config_;
  Schema schema_;
  std::string origin_;
  std::map<std::string, size_t> index_;   // key -> schema_.fields
  std::set<std::string> sections_;        // every proper prefix of a key
  std::map<std::string, Location> seen_;  // keys and sections given, where last set
  std::set<std::string> bad_;             // keys and sections whose value was rejected
  std::vector<std::string> problems_;
  std::vector<GivenPhase> schedule_;      // precision.schedule as given
};

}  // namespace

int64_t phase_last_step(const PrecisionPhase& phase, int64_t steps) {
  if (phase.until_step > 0) return phase.until_step;
  // The epsilon keeps 0.29 x 100 (28.999999999999996 in doubles) at the step the decimals say.
  if (phase.until_fraction > 0)
    return static_cast<int64_t>(std::floor(phase.until_fraction * static_cast<double>(steps) + 1e-9));
  return steps;
}

PrecisionConfig phase_precision(const PrecisionConfig& p, size_t i) {
  PrecisionConfig one = p;
  one.schedule.clear();
  one.mode = p.schedule.at(i).mode;
  one.fp8 = p.schedule.at(i).fp8;
  return one;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::string text;
  try {
    text = read_config_text(path, kMaxConfigBytes);
  } catch (const UserError& e) {
    throw UserErrors({e.what()});
  }
  return parse_config(text, path, overrides);
}

Config parse_config(const std::string& yaml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Config config;
  Loader loader(config, origin);
  const bool parsed = loader.load_text(yaml_text);
  for (const auto& flag_text : overrides) loader.apply_override(flag_text);
  // Cross-key checks on a half-read file would only add noise to the syntax error.
  if (parsed) loader.validate();
  loader.throw_if_problems();
  return config;
}

namespace {

// A field's value as the YAML it was read from (a choice by its name, a number as written).
void emit_value(YAML::Emitter& out, const Field& f) {
  std::visit(
      [&](auto member) {
        using T = std::remove_pointer_t<decltype(member)>;
        if constexpr (std::is_same_v<T, ChoiceRef>) {
          out << f.choices.at(member.get());
        } else if constexpr (std::is_same_v<T, double>) {
          out << format_double(*member);
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (member->empty() && f.empty == Empty::kNull)
            out << YAML::Null;
          else
            out << *member;
        } else {
          out << *member;
        }
      },
      f.target);
}

// precision.schedule, every phase with its resolved fp8 settings (the key names of precision.fp8).
void emit_schedule(YAML::Emitter& out, const std::vector<PrecisionPhase>& phases) {
  out << YAML::Key << last_segment(kScheduleKey) << YAML::Value
      << YAML::Comment("precision phases: mode and fp8 settings until a step") << YAML::BeginSeq;
  for (const PrecisionPhase& phase : phases) {
    out << YAML::BeginMap;
    if (phase.until_step > 0) out << YAML::Key << "until_step" << YAML::Value << phase.until_step;
    if (phase.until_fraction > 0) out << YAML::Key << "until_fraction" << YAML::Value << format_double(phase.until_fraction);
    out << YAML::Key << "mode" << YAML::Value << choice_name(phase.mode);
    Config scratch;
    scratch.precision.fp8 = phase.fp8;
    out << YAML::Key << "fp8" << YAML::Value << YAML::BeginMap;
    for (const Field& f : make_schema(scratch).fields) {
      if (f.key.rfind("precision.fp8.", 0) != 0) continue;
      out << YAML::Key << last_segment(f.key) << YAML::Value;
      emit_value(out, f);
    }
    out << YAML::EndMap << YAML::EndMap;
  }
  out << YAML::EndSeq;
}

// data.sources, each source's glob and weight as given.
void emit_sources(YAML::Emitter& out, const std::vector<DataSource>& sources) {
  out << YAML::Key << last_segment(kSourcesKey) << YAML::Value
      << YAML::Comment("training shards blended by weight (instead of data.train)") << YAML::BeginSeq;
  for (const DataSource& source : sources)
    out << YAML::Flow << YAML::BeginMap << YAML::Key << "train" << YAML::Value << source.train << YAML::Key << "weight"
        << YAML::Value << format_double(source.weight) << YAML::EndMap;
  out << YAML::EndSeq;
}

}  // namespace

std::string config_to_yaml(const Config& config) {
  Config copy = config;  // the schema binds mutable members
  const Schema schema = make_schema(copy);
  YAML::Emitter out;
  out.SetNullFormat(YAML::LowerNull);
  out << YAML::Comment("ptrain run config, resolved: every key, defaults filled in");
  out << YAML::BeginMap;
  std::vector<std::string> open;  // sections currently open, outermost first
  std::string last_precision_key;  // the schedule follows the precision section's keys
  std::string last_data_key;       // and data.sources the data section's own (data.vocab)
  for (const Field& f : schema.fields) {
    if (f.key.rfind(parent(kScheduleKey) + ".", 0) == 0) last_precision_key = f.key;
    if (parent(f.key) == parent(kSourcesKey)) last_data_key = f.key;
  }
  for (const Field& f : schema.fields) {
    const std::string section = parent(f.key);
    bool absent = false;
    for (std::string p = section; !p.empty(); p = parent(p))
      if (const auto flag = schema.presence.find(p); flag != schema.presence.end())
        absent = absent || !*flag->second;
    const auto* text_member = std::get_if<std::string*>(&f.target);
    if (absent || (text_member && f.empty == Empty::kOmit && (*text_member)->empty())) continue;
    if (copy.model.arch != Arch::llama && is_llama_setting(f.key)) continue;  // refused with gpt2 when read

    const std::vector<std::string> parts = split(f.key);
    size_t shared = 0;
    while (shared < open.size() && shared + 1 < parts.size() && open[shared] == parts[shared])
      ++shared;
    for (; open.size() > shared; open.pop_back()) out << YAML::EndMap;
    for (; open.size() + 1 < parts.size(); open.push_back(parts[open.size()]))
      out << YAML::Key << parts[open.size()] << YAML::Value << YAML::BeginMap;

    out << YAML::Key << parts.back() << YAML::Value;
    emit_value(out, f);
    out << YAML::Comment(f.help);
    if (f.key == last_precision_key && !copy.precision.schedule.empty()) {
      for (; open.size() > 1; open.pop_back()) out << YAML::EndMap;  // back to the precision map
      emit_schedule(out, copy.precision.schedule);
    }
    if (f.key == last_data_key && !copy.data.sources.empty()) emit_sources(out, copy.data.sources);
  }
  for (; !open.empty(); open.pop_back()) out << YAML::EndMap;
  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ptrain
