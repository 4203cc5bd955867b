#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"

using namespace ptrain;  // the config and its choices (config/choices.h)
using ptrain::Config;
using ptrain::parse_config;

namespace {

const char* kMinimal =
    "model:\n"
    "  n_layer: 2\n"
    "  n_head: 4\n"
    "  n_embd: 64\n"
    "  seq_len: 64\n"
    "  vocab_size: 256\n"
    "data:\n"
    "  synthetic: {vocab: 128}\n";

// The problems a config produces; empty when it is valid.
std::vector<std::string> problems_of(const std::string& yaml,
                                     const std::vector<std::string>& overrides = {}) {
  try {
    parse_config(yaml, "cfg.yaml", overrides);
  } catch (const ptrain::UserErrors& e) {
    return e.problems();
  }
  return {};
}

// The single problem a config produces (fails the test when there is not exactly one).
std::string only_problem(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  const auto problems = problems_of(yaml, overrides);
  INFO(Catch::Detail::stringify(problems));
  REQUIRE(problems.size() == 1);
  return problems[0];
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Every message follows "<origin>[:line:col]: <key>: <what>; expected <what>".
void check_shape(const std::string& message, const std::string& prefix, const std::string& key) {
  INFO(message);
  CHECK(message.rfind(prefix + ": " + key + ": ", 0) == 0);
  CHECK(contains(message, "; expected "));
}

}  // namespace

TEST_CASE("a minimal config parses with defaults", "[config]") {
  const Config c = parse_config(kMinimal, "cfg.yaml");
  CHECK(c.model.n_layer == 2);
  CHECK(c.model.n_head == 4);
  CHECK(c.model.n_embd == 64);
  CHECK(c.model.seq_len == 64);
  CHECK(c.model.vocab_size == 256);
  CHECK(c.model.init_from.empty());
  CHECK(c.model.attention == AttentionRequest::auto_);
  CHECK(c.model.fused_gelu);
  CHECK_FALSE(c.training.cuda_graph);
  CHECK(c.data.synthetic_enabled);
  CHECK(c.data.synthetic.vocab == 128);
  CHECK(c.data.synthetic.order == 2);
  CHECK(c.data.train.empty());
  CHECK(c.run.name == "run");
  CHECK(c.run.device == DeviceRequest::auto_);
  CHECK(c.run.seed == 1337);
  CHECK(c.training.steps == 500);
  CHECK(c.training.batch_tokens == 8192);
  CHECK(c.training.micro_batch == 16);
  CHECK(c.optimizer.lr == 1.0e-3);
  CHECK(c.optimizer.beta2 == 0.95);
  CHECK(c.schedule.decay == Decay::cosine);
  CHECK(c.precision.mode == PrecisionMode::fp32);
  CHECK(c.precision.fp8.recipe == Fp8Recipe::delayed);
  CHECK(c.precision.fp8.bf16_lm_head);
  CHECK(c.precision.loss_scaling.init == 65536.0);
  CHECK(c.checkpoint.resume == "never");
  CHECK(c.checkpoint.dir.empty());
  CHECK(c.logging.numerics_every == 50);
  CHECK(c.distributed.zero_stage == 0);
}

TEST_CASE("the README's example config parses", "[config]") {
  const char* yaml = R"(
run:        {name: quickstart, out_dir: runs, seed: 1337, device: auto, overwrite: false}
model:      {n_layer: 4, n_head: 4, n_embd: 128, seq_len: 128, vocab_size: 256, init_from: null,
             attention: auto}
data:       {train: "data/x/train_*.bin", val: "data/x/val_*.bin"}
training:   {steps: 500, batch_tokens: 8192, micro_batch: 16, grad_clip: 1.0,
             eval_every: 100, eval_batches: 20}
optimizer:  {lr: 1.0e-3, beta1: 0.9, beta2: 0.95, eps: 1.0e-8, weight_decay: 0.1}
schedule:   {warmup_steps: 50, decay: cosine, min_lr_ratio: 0.1}
precision:
  mode: fp32
  tf32: false
  fp8: {recipe: delayed, format: hybrid, margin: 0, amax_history: 16, amax_algo: max,
        bf16_first_last: false, bf16_lm_head: true}
  loss_scaling: {mode: auto, init: 65536, growth_factor: 2.0, backoff_factor: 0.5,
                 growth_interval: 2000, hysteresis: 1, min_scale: 1.0}
checkpoint: {every: 0, keep_last: 3, resume: never, dir: null}
logging:    {every: 1, numerics_every: 50}
distributed: {zero_stage: 0}
)";
  const Config c = parse_config(yaml, "design.yaml");
  CHECK(c.run.name == "quickstart");
  CHECK(c.data.train == "data/x/train_*.bin");
  CHECK(c.data.val == "data/x/val_*.bin");
  CHECK_FALSE(c.data.synthetic_enabled);
  CHECK(c.optimizer.eps == 1.0e-8);
}

TEST_CASE("config_to_yaml round trips every field exactly", "[config]") {
  Config c = parse_config(kMinimal, "cfg.yaml");
  c.run.name = "null";  // a string that looks like null must stay a string
  c.run.out_dir = "out dir/with: colon";
  c.run.seed = -42;
  c.run.device = DeviceRequest::cpu;
  c.run.overwrite = true;
  c.model.attention = AttentionRequest::fallback;
  c.model.fused_gelu = false;
  c.data.synthetic = {200, 3, 7, 123457, 99, 0.1 + 0.2};
  c.training = {77, 4096, 4, 32, 0.3, 0, 3, 2};
  c.training.cuda_graph = true;
  c.optimizer = {3e-4, 0.8, 0.999, 1.0 / 3.0, 0.0};
  c.schedule = {7, Decay::wsd, 0.0, 0.35};
  c.precision.tf32 = true;
  c.precision.fp8 = {Fp8Recipe::block, Fp8Format::e4m3, 2, 1024, AmaxAlgo::most_recent, true, false};
  c.precision.loss_scaling = {LossScalingMode::dynamic, 1024.5, 1.5, 0.25, 100, 2, 1e-300};
  c.checkpoint.keep_last = 9;
  c.checkpoint.dir = "ckpt";
  c.logging = {5, 1, 7, 33, "Call me: \"Ishmael\"\n", 0.25};
  c.distributed.grad_reduce_dtype = GradReduceDtype::bf16;

  const std::string yaml = ptrain::config_to_yaml(c);
  INFO(yaml);
  const Config back = parse_config(yaml, "config.yaml");
  // Doubles print shortest-exact, so equal text means bit-equal values for every key.
  CHECK(ptrain::config_to_yaml(back) == yaml);
  CHECK(back.run.name == "null");
  CHECK(back.run.out_dir == c.run.out_dir);
  CHECK(back.run.seed == -42);
  CHECK(back.run.overwrite);
  CHECK_FALSE(back.model.fused_gelu);
  CHECK(back.training.cuda_graph);
  CHECK(back.data.synthetic_enabled);
  CHECK(back.data.synthetic.val_fraction == c.data.synthetic.val_fraction);
  CHECK(back.data.synthetic.tokens == 123457);
  CHECK(back.training.seq_len == 32);
  CHECK(back.training.grad_clip == 0.3);
  CHECK(back.optimizer.eps == 1.0 / 3.0);
  CHECK(back.schedule.decay == Decay::wsd);
  CHECK(back.logging.sample_prompt == c.logging.sample_prompt);
  CHECK(back.logging.sample_temperature == 0.25);
  CHECK(back.precision.fp8.amax_algo == AmaxAlgo::most_recent);
  CHECK_FALSE(back.precision.fp8.bf16_lm_head);
  CHECK(back.precision.loss_scaling.min_scale == 1e-300);
  CHECK(back.checkpoint.dir == "ckpt");
  CHECK(back.logging.numerics_every == 1);
  CHECK(back.distributed.grad_reduce_dtype == GradReduceDtype::bf16);
}

TEST_CASE("config_to_yaml writes nulls and omits absent data", "[config]") {
  const std::string synthetic = ptrain::config_to_yaml(parse_config(kMinimal, "cfg.yaml"));
  CHECK(contains(synthetic, "init_from: null"));
  CHECK(contains(synthetic, "dir: null"));
  CHECK(contains(synthetic, "synthetic:"));
  CHECK_FALSE(contains(synthetic, "\n  train:"));
  CHECK_FALSE(contains(synthetic, "\n  val:"));

  const Config shards = parse_config(
      "model: {n_layer: 1, n_head: 1, n_embd: 8, seq_len: 16, vocab_size: 300}\n"
      "data: {train: 'a_*.bin', val: 'b_*.bin'}\n",
      "cfg.yaml");
  const std::string yaml = ptrain::config_to_yaml(shards);
  CHECK(contains(yaml, "train: a_*.bin"));
  CHECK_FALSE(contains(yaml, "synthetic:"));
  CHECK_FALSE(parse_config(yaml, "x").data.synthetic_enabled);
}

TEST_CASE("null and ~ mean empty for init_from and checkpoint.dir", "[config]") {
  const Config c = parse_config(std::string(kMinimal) + "checkpoint: {dir: ~}\n", "cfg.yaml",
                                {"model.init_from=null"});
  CHECK(c.checkpoint.dir.empty());
  CHECK(c.model.init_from.empty());
  const auto message = only_problem(std::string(kMinimal) + "run: {name: null}\n");
  check_shape(message, "cfg.yaml:9:7", "run.name");
}

TEST_CASE("malformed YAML reports file, line and column", "[config]") {
  const auto message = only_problem("model:\n  n_layer: [1, 2\ndata: {}\n");
  INFO(message);
  CHECK(message.rfind("cfg.yaml:", 0) == 0);
  CHECK(contains(message, "malformed YAML"));
  CHECK(contains(message, "; expected "));
  CHECK(contains(message, "cfg.yaml:3:"));  // where the flow sequence turned out unterminated

  const auto indent = only_problem("model:\n  n_layer: 1\n n_head: 2\n");
  CHECK(indent.rfind("cfg.yaml:3:2: malformed YAML", 0) == 0);
}

TEST_CASE("the top level and each section must be maps", "[config]") {
  check_shape(only_problem("- 1\n- 2\n"), "cfg.yaml:1:1", "top level");
  CHECK(contains(only_problem("just text\n"), "expected a map with keys run, model, data"));

  const auto section = only_problem(std::string(kMinimal) + "training: [1, 2]\n");
  check_shape(section, "cfg.yaml:9:1", "training");
  CHECK(contains(section, "got a list"));
  CHECK(contains(section, "steps"));

  check_shape(only_problem(std::string(kMinimal) + "precision: {fp8: 3}\n"), "cfg.yaml:9:13",
              "precision.fp8");
}

TEST_CASE("unknown keys are reported with a suggestion", "[config]") {
  const auto typo = only_problem(
      "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 64, vocab_size: 256, n_emdb: 3}\n"
      "data: {synthetic: {}}\n");
  check_shape(typo, "cfg.yaml:1:74", "model.n_emdb");
  CHECK(contains(typo, "unknown key"));
  CHECK(contains(typo, "did you mean \"model.n_embd\"?"));

  const auto section = only_problem(std::string(kMinimal) + "optimiser: {lr: 0.1}\n");
  check_shape(section, "cfg.yaml:9:1", "optimiser");
  CHECK(contains(section, "did you mean \"optimizer\"?"));

  // Right name, wrong section.
  const auto moved = only_problem(std::string(kMinimal) + "training: {lr: 0.1}\n");
  check_shape(moved, "cfg.yaml:9:12", "training.lr");
  CHECK(contains(moved, "did you mean \"optimizer.lr\"?"));

  const auto nothing_close = only_problem(std::string(kMinimal) + "logging: {colour: red}\n");
  CHECK(contains(nothing_close, "expected a key of logging: every, numerics_every"));
  CHECK_FALSE(contains(nothing_close, "did you mean"));

  check_shape(only_problem(std::string(kMinimal) + "logging: {every: 2, every: 3}\n"),
              "cfg.yaml:9:21", "logging.every");
}

TEST_CASE("values of the wrong type are rejected", "[config]") {
  const auto text = only_problem(std::string(kMinimal) + "training:\n  steps: many\n");
  check_shape(text, "cfg.yaml:10:3", "training.steps");
  CHECK(contains(text, "many is not an integer; expected an integer >= 1"));

  const auto fraction = only_problem(std::string(kMinimal) + "training: {steps: 3.5}\n");
  CHECK(contains(fraction, "training.steps: 3.5 is not an integer"));

  const auto quoted = only_problem(std::string(kMinimal) + "optimizer: {lr: '0.1'}\n");
  CHECK(contains(quoted, "optimizer.lr: \"0.1\" is a quoted string; expected a number in (0, 100]"));

  const auto list = only_problem(std::string(kMinimal) + "run: {seed: [1]}\n");
  CHECK(contains(list, "run.seed: got a list; expected an integer"));

  const auto not_bool = only_problem(std::string(kMinimal) + "run: {overwrite: maybe}\n");
  CHECK(contains(not_bool, "run.overwrite: maybe is not true or false; expected true or false"));

  const auto too_big = only_problem(std::string(kMinimal) + "precision: {fp8: {margin: 1e10}}\n");
  CHECK(contains(too_big, "precision.fp8.margin"));

  // yaml-cpp decodes yes/no/on/off as booleans, and integers are numbers.
  const Config c = parse_config(std::string(kMinimal) +
                                    "run: {overwrite: yes}\nprecision: {tf32: on}\n"
                                    "optimizer: {lr: 1}\n",
                                "cfg.yaml");
  CHECK(c.run.overwrite);
  CHECK(c.precision.tf32);
  CHECK(c.optimizer.lr == 1.0);
}

TEST_CASE("enum values must be among the choices", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"run.device=gpu", "one of auto, cpu, cuda"},
      {"model.attention=flash", "one of auto, cudnn, fallback"},
      {"schedule.decay=step", "one of cosine, linear, constant, wsd"},
      {"precision.mode=fp4", "one of fp32, bf16, fp16, fp8"},
      {"precision.fp8.recipe=mxfp8", "one of delayed, current, block"},
      {"precision.fp8.format=e5m2", "one of hybrid, e4m3"},
      {"precision.fp8.amax_algo=mean", "one of max, most_recent"},
      {"precision.loss_scaling.mode=on", "one of auto, off, static, dynamic"},
      {"distributed.grad_reduce_dtype=fp16", "one of fp32, bf16"},
  };
  for (const auto& [flag, expected] : cases) {
    const std::string key = flag.substr(0, flag.find('='));
    const auto message = only_problem(kMinimal, {flag});
    check_shape(message, "--set " + flag, key);
    CHECK(contains(message, "is not a valid choice; expected " + expected));
  }
  CHECK(parse_config(kMinimal, "cfg.yaml", {"checkpoint.resume=never"}).checkpoint.resume ==
        "never");
}

TEST_CASE("out-of-range values are rejected with the allowed range", "[config]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"model.n_layer=0", "an integer in [1, 1024]"},
      {"model.n_head=0", "an integer in [1, 65536]"},
      {"model.n_embd=-64", "an integer in [1, 65536]"},
      {"model.seq_len=0", "an integer in [1, 1048576]"},
      {"model.vocab_size=1", "an integer in [2, 1048576]"},
      {"model.vocab_size=1048577", "an integer in [2, 1048576]"},
      {"training.micro_batch=0", "an integer >= 1"},
      {"training.steps=0", "an integer >= 1"},
      {"training.batch_tokens=0", "an integer >= 1"},
      {"training.seq_len=-1", "an integer >= 0"},
      {"training.grad_clip=-0.5", "a number >= 0"},
      {"training.eval_every=-1", "an integer >= 0"},
      {"training.eval_batches=0", "an integer >= 1"},
      {"training.threads=-2", "an integer >= 0"},
      {"optimizer.lr=0", "a number in (0, 100]"},
      {"optimizer.lr=.inf", "a number in (0, 100]"},
      {"optimizer.lr=1e3", "a number in (0, 100]"},  // a typo's exponent
      {"optimizer.beta1=1", "a number in [0, 1)"},
      {"optimizer.beta2=-0.1", "a number in [0, 1)"},
      {"optimizer.eps=0", "a number in (0, 1]"},
      {"optimizer.weight_decay=-1", "a number in [0, 100]"},
      {"schedule.warmup_steps=-1", "an integer >= 0"},
      {"schedule.min_lr_ratio=1.5", "a number in [0, 1]"},
      {"schedule.wsd_decay_fraction=0", "a number in (0, 1]"},
      {"precision.fp8.margin=-1", "an integer in [0, 32]"},
      {"precision.fp8.amax_history=0", "an integer in [1, 1024]"},
      {"precision.loss_scaling.init=0", "a number in (0, 1.8446744073709552e+19]"},
      {"precision.loss_scaling.init=1e300", "a number in (0, 1.8446744073709552e+19]"},
      {"precision.loss_scaling.growth_factor=1", "a number in (1, 1024]"},
      {"precision.loss_scaling.backoff_factor=1", "a number in (0, 1)"},
      {"precision.loss_scaling.growth_interval=0", "an integer >= 1"},
      {"precision.loss_scaling.hysteresis=0", "an integer >= 1"},
      {"precision.loss_scaling.min_scale=0", "a number in (0, 1.8446744073709552e+19]"},
      {"checkpoint.every=-1", "an integer >= 0"},
      {"checkpoint.keep_last=0", "an integer >= 1"},
      {"logging.every=0", "an integer >= 1"},
      {"logging.numerics_every=0", "an integer >= 1"},
      {"distributed.zero_stage=4", "an integer in [0, 3]"},
      {"data.synthetic.vocab=1", "an integer in [2, 1048576]"},
      {"data.synthetic.order=0", "an integer >= 1"},
      {"data.synthetic.branching=0", "an integer >= 1"},
      {"data.synthetic.tokens=999", "an integer >= 1000"},
      {"data.synthetic.val_fraction=0", "a number in (0, 1)"},
      {"data.synthetic.val_fraction=1", "a number in (0, 1)"},
  };
  for (const auto& [flag, expected] : cases) {
    const std::string key = flag.substr(0, flag.find('='));
    const auto message = only_problem(kMinimal, {flag});
    INFO(message);
    check_shape(message, "--set " + flag, key);
    CHECK(contains(message, "is out of range; expected " + expected));
  }
  // From a file the message carries the position.
  check_shape(only_problem(std::string(kMinimal) + "optimizer:\n  beta1: 1.0\n"), "cfg.yaml:10:3",
              "optimizer.beta1");
}

TEST_CASE("required model keys have no default", "[config]") {
  const auto problems = problems_of("model: {n_layer: 2, n_head: 4}\ndata: {synthetic: {}}\n");
  REQUIRE(problems.size() == 3);
  check_shape(problems[0], "cfg.yaml:1:1", "model.n_embd");
  CHECK(contains(problems[0], "required, no default; expected an integer in [1, "));
  check_shape(problems[1], "cfg.yaml:1:1", "model.seq_len");
  check_shape(problems[2], "cfg.yaml:1:1", "model.vocab_size");

  // Without a model section there is no line to point at.
  const auto none = problems_of("data: {synthetic: {}}\n");
  REQUIRE(none.size() == 5);
  check_shape(none[0], "cfg.yaml", "model.n_layer");
}

TEST_CASE("data needs synthetic or both train and val", "[config]") {
  const std::string model =
      "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 64, vocab_size: 256}\n";
  const auto missing = only_problem(model);
  check_shape(missing, "cfg.yaml", "data");
  CHECK(contains(missing, "expected either data.synthetic, or data.val with data.train or data.sources"));

  const auto empty = only_problem(model + "data: {}\n");
  check_shape(empty, "cfg.yaml:2:1", "data");

  const auto no_val = only_problem(model + "data:\n  train: 'x_*.bin'\n");
  check_shape(no_val, "cfg.yaml:3:3", "data.val");
  CHECK(contains(no_val, "missing"));

  const auto both = only_problem(model + "data:\n  synthetic: {}\n  train: a\n  val: b\n");
  check_shape(both, "cfg.yaml:4:3", "data.train");
  CHECK(contains(both, "cannot be combined with data.synthetic"));

  // `synthetic:` with no value still switches the synthetic corpus on, with defaults.
  const Config c = parse_config(model + "data:\n  synthetic:\n", "cfg.yaml");
  CHECK(c.data.synthetic_enabled);
  CHECK(c.data.synthetic.vocab == 256);
}

TEST_CASE("cross-key checks report at the first key named", "[config]") {
  const auto heads = only_problem(kMinimal, {"model.n_embd=66"});
  check_shape(heads, "--set model.n_embd=66", "model.n_embd");
  CHECK(contains(heads,
                 "66 is not divisible by model.n_head = 4; expected a multiple of "
                 "model.n_head, e.g. 64 or 68"));

  const auto context = only_problem(std::string(kMinimal) + "training:\n  seq_len: 128\n");
  check_shape(context, "cfg.yaml:10:3", "training.seq_len");
  CHECK(contains(context, "above the model's context model.seq_len = 64"));

  const auto batch = only_problem(std::string(kMinimal) + "training: {batch_tokens: 5000}\n");
  check_shape(batch, "cfg.yaml:9:12", "training.batch_tokens");
  CHECK(contains(batch, "16 * 64 = 1024; expected a multiple of 1024, e.g. 4096 or 5120"));

  // The batch check uses the training sequence length when one is set.
  CHECK(parse_config(kMinimal, "cfg.yaml", {"training.seq_len=32", "training.batch_tokens=512"})
            .training.batch_tokens == 512);
  // Default batch_tokens: the message points at the key that broke it.
  const auto micro = only_problem(std::string(kMinimal) + "training: {micro_batch: 3}\n");
  check_shape(micro, "cfg.yaml:9:12", "training.batch_tokens");
  CHECK(contains(micro, "e.g. 8064 or 8256"));

  const auto vocab = only_problem(kMinimal, {"data.synthetic.vocab=300"});
  check_shape(vocab, "--set data.synthetic.vocab=300", "data.synthetic.vocab");
  CHECK(contains(vocab, "300 is above model.vocab_size = 256; expected at most 256"));

  const auto branching =
      only_problem(kMinimal, {"data.synthetic.vocab=8", "data.synthetic.branching=9"});
  check_shape(branching, "--set data.synthetic.branching=9", "data.synthetic.branching");
  CHECK(contains(branching, "above data.synthetic.vocab = 8; expected at most 8"));
}

TEST_CASE("llama's settings round trip, and a GPT-2 config.yaml leaves them out", "[config][llama]") {
  const Config llama = parse_config(kMinimal, "cfg.yaml",
                                    {"model.arch=llama", "model.n_kv_head=2", "model.rope_theta=500000",
                                     "model.norm_eps=1e-6", "model.mlp_multiple_of=64", "model.tie_embeddings=true",
                                     "model.qk_norm=true"});
  CHECK(llama.model.kv_heads() == 2);
  CHECK(llama.model.swiglu_hidden() == 192);  // 8 * 64 / 3 = 170, rounded up to a multiple of 64
  const std::string yaml = ptrain::config_to_yaml(llama);
  INFO(yaml);
  const Config back = parse_config(yaml, "config.yaml");
  CHECK(ptrain::config_to_yaml(back) == yaml);
  CHECK(back.model.rope_theta == 500000);
  CHECK(back.model.norm_eps == 1e-6);
  CHECK(back.model.tie_embeddings == TieEmbeddings::yes);
  CHECK(back.model.qk_norm);
  CHECK(parse_config(kMinimal, "cfg.yaml", {"model.arch=llama", "model.mlp_hidden=100"}).model.swiglu_hidden() == 100);

  const std::string gpt2 = ptrain::config_to_yaml(parse_config(kMinimal, "cfg.yaml"));
  CHECK(contains(gpt2, "arch: gpt2"));
  CHECK_FALSE(contains(gpt2, "n_kv_head"));
  CHECK_FALSE(contains(gpt2, "rope_theta"));
  CHECK_FALSE(contains(gpt2, "qk_norm"));
}

TEST_CASE("llama's settings are checked, and refused with gpt2", "[config][llama]") {
  const auto with_gpt2 = only_problem(kMinimal, {"model.n_kv_head=2"});
  check_shape(with_gpt2, "--set model.n_kv_head=2", "model.n_kv_head");
  CHECK(contains(with_gpt2, "is a llama setting, and model.arch is gpt2"));
  const auto qk_gpt2 = only_problem(kMinimal, {"model.qk_norm=true"});
  check_shape(qk_gpt2, "--set model.qk_norm=true", "model.qk_norm");
  CHECK(contains(qk_gpt2, "is a llama setting, and model.arch is gpt2"));
  const auto untied = only_problem(kMinimal, {"model.tie_embeddings=false"});
  check_shape(untied, "--set model.tie_embeddings=false", "model.tie_embeddings");

  const auto odd_head = only_problem(kMinimal, {"model.arch=llama", "model.n_embd=60", "model.n_head=4"});
  check_shape(odd_head, "--set model.n_embd=60", "model.n_embd");
  CHECK(contains(odd_head, "60 / model.n_head 4 = 15 is an odd head size"));

  // cuDNN's graph takes grouped K/V heads (whether a GPU's cuDNN runs it is decided at start-up).
  CHECK(problems_of(kMinimal, {"model.arch=llama", "model.n_kv_head=2", "model.attention=cudnn"}).empty());
  CHECK(problems_of(kMinimal, {"model.arch=llama", "model.attention=cudnn"}).empty());  // multi-head

  const auto groups = only_problem(kMinimal, {"model.arch=llama", "model.n_kv_head=3"});
  check_shape(groups, "--set model.n_kv_head=3", "model.n_kv_head");
  CHECK(contains(groups, "3 does not divide model.n_head = 4"));
  CHECK(contains(groups, "expected a divisor of 4, e.g. 2 or 4"));

  // FP8 GEMMs: the SwiGLU width (8 * 64 / 3 = 170, rounded to 256) and the K/V width 1 * 16.
  CHECK(problems_of(kMinimal, {"model.arch=llama", "model.n_kv_head=1", "precision.mode=fp8"}).empty());
  const auto hidden = only_problem(kMinimal, {"model.arch=llama", "model.mlp_hidden=100", "precision.mode=fp8"});
  check_shape(hidden, "--set model.mlp_hidden=100", "model.mlp_hidden");
  CHECK(contains(hidden, "the SwiGLU width 100 is not a multiple of 16"));
  const auto kv = only_problem(kMinimal, {"model.arch=llama", "model.n_embd=128", "model.n_kv_head=2", "precision.mode=fp8",
                                          "precision.fp8.recipe=block"});
  check_shape(kv, "--set model.n_kv_head=2", "model.n_kv_head");
  CHECK(contains(kv, "n_kv_head * head_size = 64 is not a multiple of 128"));
}

// Primary FP8 weights keep no bf16 copy of the block linears' weights: whatever would run one
// of them in bf16 is refused by name. ZeRO-1 takes them (its ranks cast a part each).
TEST_CASE("precision.fp8.primary_weights: refused where a block would run in bf16", "[config]") {
  const std::vector<std::string> fp8 = {"precision.mode=fp8", "precision.fp8.primary_weights=true"};
  CHECK(problems_of(kMinimal, fp8).empty());
  std::vector<std::string> zero1 = fp8;
  zero1.push_back("distributed.zero_stage=1");
  CHECK(problems_of(kMinimal, zero1).empty());
  CHECK(parse_config(kMinimal, "cfg.yaml", fp8).precision.fp8.primary_weights);
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), fp8.begin(), fp8.end());
    return only_problem(kMinimal, more);
  };
  struct Case {
    std::vector<std::string> overrides;
    const char* prefix;
    const char* says;
  };
  for (const Case& c :
       {Case{{"precision.mode=bf16"}, "--set precision.mode=bf16", "true with precision.mode bf16"},
        Case{{"precision.fp8.bf16_first_last=true"}, "--set precision.fp8.bf16_first_last=true",
             "whose bf16 blocks would have no bf16 weights"},
        Case{{"training.guard.action=skip", "checkpoint.every=5", "training.guard.action=rollback"},
             "--set training.guard.action=rollback", "rollback, which goes on in bf16"}}) {
    const std::string message = with(c.overrides);
    check_shape(message, c.prefix, "precision.fp8.primary_weights");
    CHECK(contains(message, c.says));
  }
  // A schedule's switches remake the FP8 layers, even between two FP8 recipes; asked for by the
  // precision section or by a phase of its own.
  const std::string schedule = "precision.schedule=[{until_step: 5, mode: fp8, fp8: {recipe: current}}, {mode: fp8}]";
  const std::string message = only_problem(kMinimal, {"precision.fp8.primary_weights=true", schedule});
  check_shape(message, "--set " + schedule, "precision.fp8.primary_weights");
  CHECK(contains(message, "true with precision.schedule"));
  const std::string phase_asks =
      "precision.schedule=[{until_step: 5, mode: fp8, fp8: {primary_weights: true}}, {mode: fp8}]";
  CHECK(contains(only_problem(kMinimal, {phase_asks}), "true with precision.schedule"));
}

// The MLP's input kept as FP8 codes replaces its bf16 copy in FP8 blocks only, and saves only
// where every layer's is kept: whatever would run a block in bf16, and recomputation, is refused
// by name.
TEST_CASE("precision.fp8.mlp_input_codes: refused with bf16 blocks and with recomputation", "[config]") {
  const std::vector<std::string> fp8 = {"precision.mode=fp8", "precision.fp8.mlp_input_codes=true"};
  CHECK(problems_of(kMinimal, fp8).empty());
  CHECK(parse_config(kMinimal, "cfg.yaml", fp8).precision.fp8.mlp_input_codes);
  const auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), fp8.begin(), fp8.end());
    return only_problem(kMinimal, more);
  };
  struct Case {
    std::vector<std::string> overrides;
    const char* prefix;
    const char* says;
  };
  for (const Case& c :
       {Case{{"precision.mode=bf16"}, "--set precision.mode=bf16", "true with precision.mode bf16"},
        Case{{"precision.fp8.bf16_first_last=true"}, "--set precision.fp8.bf16_first_last=true",
             "whose bf16 blocks keep their MLP input in bf16"},
        Case{{"training.guard.action=skip", "checkpoint.every=5", "training.guard.action=rollback"},
             "--set training.guard.action=rollback", "rollback, which goes on in bf16 blocks"},
        Case{{"training.recompute=mlp"}, "--set training.recompute=mlp", "true with training.recompute mlp"},
        Case{{"training.recompute=block"}, "--set training.recompute=block", "true with training.recompute block"}}) {
    const std::string message = with(c.overrides);
    check_shape(message, c.prefix, "precision.fp8.mlp_input_codes");
    CHECK(contains(message, c.says));
  }
  const std::string schedule = "precision.schedule=[{until_step: 5, mode: fp8, fp8: {mlp_input_codes: true}}, {mode: fp8}]";
  CHECK(contains(only_problem(kMinimal, {schedule}), "true with precision.schedule"));
}

TEST_CASE("fp8 needs aligned model dimensions and a supported block size", "[config]") {
  for (const char* mode : {"fp32", "bf16", "fp16", "fp8"}) {
    CAPTURE(mode);
    CHECK(problems_of(kMinimal, {std::string("precision.mode=") + mode}).empty());
  }
  const auto odd = only_problem(kMinimal, {"precision.mode=fp8", "model.n_embd=72", "model.n_head=4"});
  check_shape(odd, "--set model.n_embd=72", "model.n_embd");
  CHECK(contains(odd, "72 is not a multiple of 16 as precision.mode fp8 needs; expected a multiple of 16"));
  CHECK(problems_of(kMinimal, {"precision.mode=bf16", "model.n_embd=72"}).empty());

  const auto block = only_problem(kMinimal, {"precision.mode=fp8", "precision.fp8.recipe=block"});
  check_shape(block, "cfg.yaml:4:3", "model.n_embd");
  CHECK(contains(block, "64 is not a multiple of 128 as precision.mode fp8 with recipe block needs"));
  CHECK(problems_of(kMinimal, {"precision.mode=fp8", "precision.fp8.recipe=block", "model.n_embd=128"}).empty());

  const auto size = only_problem(kMinimal, {"precision.fp8.block_size=64"});
  check_shape(size, "--set precision.fp8.block_size=64", "precision.fp8.block_size");
  CHECK(contains(size, "expected 128"));

  for (const char* bad : {"precision.fp8.recipe=tensorwise", "precision.fp8.format=e5m2", "precision.fp8.margin=-1",
                          "precision.fp8.amax_history=0", "precision.fp8.amax_algo=mean"}) {
    CAPTURE(bad);
    CHECK(problems_of(kMinimal, {bad}).size() == 1);
  }
}

// (A ';' in a test's name splits it in two for ctest, and neither half runs anything.)
TEST_CASE("keys checked later are accepted, and ZeRO-3 is refused with a precision schedule", "[config]") {
  CHECK(problems_of(kMinimal, {"run.device=cuda"}).empty());  // the device is checked when training starts

  CHECK(problems_of(kMinimal, {"model.init_from=gpt2.bin"}).empty());  // the file is checked when training starts

  CHECK(problems_of(kMinimal, {"checkpoint.resume=auto", "checkpoint.every=100"}).empty());

  CHECK(problems_of(kMinimal, {"distributed.zero_stage=1"}).empty());
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=2"}).empty());
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=2", "precision.mode=fp8", "precision.fp8.primary_weights=true"})
            .empty());
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=3", "precision.mode=bf16"}).empty());
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=3", "precision.mode=fp8"}).empty());
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=3", "precision.mode=fp8", "precision.fp8.primary_weights=true"})
            .empty());
  const auto zero = only_problem(
      kMinimal, {"distributed.zero_stage=3", "precision.schedule=[{until_step: 5, mode: bf16}, {mode: fp8}]"});
  check_shape(zero, "--set distributed.zero_stage=3", "distributed.zero_stage");
  CHECK(contains(zero, "3 with a precision.schedule: switching precision with sharded parameters is not implemented; "
                       "expected one precision.mode, or distributed.zero_stage 2"));
  CHECK(contains(only_problem(kMinimal, {"distributed.zero_stage=4"}), "an integer in [0, 3]"));
  CHECK(problems_of(kMinimal, {"distributed.zero_stage=2", "distributed.grad_reduce_dtype=bf16"}).empty());
}

TEST_CASE("all problems are reported together", "[config]") {
  const char* yaml =
      "model:\n"
      "  n_layer: zero\n"  // wrong type
      "  n_head: 4\n"
      "  n_embd: 66\n"  // not divisible by n_head
      "  seq_len: 64\n"
      "  vocab_size: 1\n"           // out of range
      "  dropout: 0.1\n"            // unknown
      "optimizer: {lr: -1}\n"       // out of range
      "precision: {mode: fp8}\n";   // n_embd not a multiple of 16; and data is missing
  const auto problems = problems_of(yaml, {"schedule.decay=exp"});
  INFO(Catch::Detail::stringify(problems));
  REQUIRE(problems.size() == 8);
  CHECK(contains(problems[0], "cfg.yaml:2:3: model.n_layer"));
  CHECK(contains(problems[1], "cfg.yaml:6:3: model.vocab_size"));
  CHECK(contains(problems[2], "cfg.yaml:7:3: model.dropout"));
  CHECK(contains(problems[3], "cfg.yaml:8:13: optimizer.lr"));
  CHECK(contains(problems[4], "--set schedule.decay=exp: schedule.decay"));
  CHECK(contains(problems[5], "data: no training data"));
  CHECK(contains(problems[6], "cfg.yaml:4:3: model.n_embd"));
  CHECK(contains(problems[7], "cfg.yaml:4:3: model.n_embd: 66 is not a multiple of 16"));

  try {
    parse_config(yaml, "cfg.yaml");
    FAIL("expected UserErrors");
  } catch (const ptrain::UserError& e) {
    CHECK(contains(e.what(), "7 problems:"));
  }
}

TEST_CASE("set overrides change keys of the file and adds new ones", "[config]") {
  const Config c = parse_config(
      kMinimal, "cfg.yaml",
      {"model.n_layer=6", "optimizer.lr=3e-4", "run.name=my run", "data.synthetic.order=3",
       "precision.fp8.recipe=current", "training={steps: 9}", "model.n_layer=8"});
  CHECK(c.model.n_layer == 8);  // the last override wins
  CHECK(c.optimizer.lr == 3e-4);
  CHECK(c.run.name == "my run");
  CHECK(c.data.synthetic.order == 3);
  CHECK(c.data.synthetic.vocab == 128);
  CHECK(c.precision.fp8.recipe == Fp8Recipe::current);
  CHECK(c.training.steps == 9);

  // An override alone can switch on the synthetic corpus.
  const Config synthetic =
      parse_config("model: {n_layer: 1, n_head: 1, n_embd: 8, seq_len: 16, vocab_size: 64}\n",
                   "cfg.yaml", {"data.synthetic.vocab=64"});
  CHECK(synthetic.data.synthetic_enabled);
  CHECK(synthetic.data.synthetic.vocab == 64);
}

TEST_CASE("a set override with an unknown key or bad syntax is an error", "[config]") {
  const auto unknown = only_problem(kMinimal, {"model.n_embed=64"});
  check_shape(unknown, "--set model.n_embed=64", "model.n_embed");
  CHECK(contains(unknown, "unknown key"));
  CHECK(contains(unknown, "did you mean \"model.n_embd\"?"));

  const auto no_equals = only_problem(kMinimal, {"model.n_layer"});
  check_shape(no_equals, "--set model.n_layer", "model.n_layer");
  CHECK(contains(no_equals, "expected section.key=value"));

  const auto bad_value = only_problem(kMinimal, {"model.n_layer=[1"});
  check_shape(bad_value, "--set model.n_layer=[1", "model.n_layer");
  CHECK(contains(bad_value, "not valid YAML"));

  const auto wrong_type = only_problem(kMinimal, {"model.n_layer=four"});
  CHECK(contains(wrong_type, "--set model.n_layer=four: model.n_layer: four is not an integer"));
}

TEST_CASE("load_config reads a file and names a missing one", "[config]") {
  const std::string path = "/tmp/ptrain_test_config_" + std::to_string(::getpid()) + ".yaml";
  {
    std::ofstream out(path);
    out << kMinimal;
  }
  const Config c = ptrain::load_config(path, {"training.steps=3"});
  CHECK(c.training.steps == 3);
  try {
    ptrain::load_config(path, {"training.steps=0"});
    FAIL("expected UserErrors");
  } catch (const ptrain::UserErrors& e) {
    REQUIRE(e.problems().size() == 1);
    CHECK(contains(e.problems()[0], "--set training.steps=0: training.steps"));
  }
  std::remove(path.c_str());

  try {
    ptrain::load_config("/nonexistent/run.yaml");
    FAIL("expected UserError");
  } catch (const ptrain::UserError& e) {
    CHECK(contains(e.what(), "/nonexistent/run.yaml"));
    CHECK(contains(e.what(), "expected"));
  }
  CHECK_THROWS_AS(ptrain::load_config("/tmp"), ptrain::UserError);
}

TEST_CASE("every config shipped in configs/ is valid", "[config]") {
  int checked = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(std::string(PTRAIN_SOURCE_DIR) + "/configs")) {
    if (entry.path().extension() != ".yaml") continue;
    CAPTURE(entry.path().string());
    CHECK_NOTHROW(ptrain::load_config(entry.path().string()));
    ++checked;
  }
  CHECK(checked >= 10);
}

TEST_CASE("the nesting pre-check counts levels as YAML nests them, and refuses only deep ones", "[config]") {
  // Valid configs that a count of spaces or of brackets anywhere would refuse.
  const std::string pad140(140, ' '), pad150(150, ' ');
  const std::string deep_indent = std::string(kMinimal) + "run:\n" + pad140 + "name: indented\n";
  CHECK(parse_config(deep_indent, "cfg.yaml").run.name == "indented");
  const std::string block_scalar = std::string(kMinimal) + "run:\n  name: >-\n" + pad150 + "folded\n";
  CHECK(parse_config(block_scalar, "cfg.yaml").run.name == "folded");
  const std::string brackets = std::string(kMinimal) + "run:\n  name: a" + std::string(40, '[') + "\n";
  CHECK(parse_config(brackets, "cfg.yaml").run.name == "a" + std::string(40, '['));
  const std::string quoted = std::string(kMinimal) + "run: {name: 'it''s " + std::string(40, '{') + "'}\n";
  CHECK(parse_config(quoted, "cfg.yaml").run.name == "it's " + std::string(40, '{'));
  // Deep ones are refused before yaml-cpp recurses into them.
  const auto nesting = [](const std::string& yaml) {
    const std::vector<std::string> p = problems_of(yaml);
    return p.size() == 1 ? p[0] : std::string("(" + std::to_string(p.size()) + " problems)");
  };
  std::string lists = "run: x\nlist:\n";
  for (int level = 0; level < 200; ++level) lists += std::string(static_cast<size_t>(level), ' ') + "-\n";
  CHECK_THAT(nesting(lists), Catch::Contains("nested more than 128 levels deep"));
  const std::string deep = std::string(40, '[') + std::string(40, ']');
  for (const std::string before : {"run: ", "run: &a ", "run: !!seq ", "run:\t", "--- ", "run:\n  - "}) {
    INFO(before);
    CHECK_THAT(nesting(before + deep + "\n"), Catch::Contains("nests [ ] or { } more than 32 levels deep"));
  }
  CHECK_THAT(nesting("run: \"" + std::string(300, '[') + "\"\n"), Catch::Contains("more than 256 levels deep"));
  CHECK_THAT(nesting("run:\n  - " + std::string(200, '-') + "\n"), !Catch::Contains("levels deep"));
}

TEST_CASE("data.sources blends shard globs by weight, in place of data.train", "[config]") {
  const std::string base =
      "model: {n_layer: 2, n_head: 4, n_embd: 64, seq_len: 64, vocab_size: 256}\n"
      "data:\n"
      "  val: \"v/val_*.bin\"\n";
  const std::string sources =
      "  sources:\n"
      "    - {train: \"web/train_*.bin\", weight: 0.7}\n"
      "    - {train: \"code/train_*.bin\", weight: 0.3}\n";
  const Config c = parse_config(base + sources, "cfg.yaml");
  REQUIRE(c.data.sources.size() == 2);
  CHECK(c.data.sources[0].train == "web/train_*.bin");
  CHECK(c.data.sources[0].weight == 0.7);
  CHECK(c.data.sources[1].train == "code/train_*.bin");
  CHECK(c.data.sources[1].weight == 0.3);
  CHECK(c.data.train.empty());
  // The resolved config lists them and reads back the same.
  const Config again = parse_config(config_to_yaml(c), "resolved.yaml");
  REQUIRE(again.data.sources.size() == 2);
  CHECK(again.data.sources[1].train == "code/train_*.bin");
  CHECK(again.data.sources[1].weight == 0.3);
  // --set replaces the list, and null removes it.
  const Config one = parse_config(base + sources, "cfg.yaml", {"data.sources=[{train: \"x_*.bin\", weight: 2}]"});
  REQUIRE(one.data.sources.size() == 1);
  CHECK(one.data.sources[0].weight == 2);
  CHECK(contains(only_problem(base + sources, {"data.sources=null"}), "data.train: missing while data.val is set"));
  // A weight of 0 turns a source off; a source of some weight is needed.
  CHECK(parse_config(base + sources, "cfg.yaml", {"data.sources=[{train: a, weight: 0}, {train: b, weight: 1}]"})
            .data.sources[0]
            .weight == 0);

  const std::vector<std::pair<std::string, std::string>> bad = {
      {"data.sources=[{train: a, weight: -0.5}, {train: b, weight: 1}]",
       "data.sources[1].weight: -0.5 is out of range; expected a number >= 0"},
      {"data.sources=[{train: a, weight: 0}, {train: b, weight: 0}]",
       "data.sources: every weight is 0; expected at least one weight above 0"},
      {"data.sources=[{train: a, weight: 1e308}, {train: b, weight: 1e308}]",
       "data.sources: the weights sum past the largest number"},
      {"data.sources=[{train: a}]", "data.sources[1].weight: missing; expected a number >= 0"},
      {"data.sources=[{weight: 1}]", "data.sources[1].train: missing; expected a glob of token shards"},
      {"data.sources=[{train: \"\", weight: 1}]", "data.sources[1].train: an empty glob"},
      {"data.sources=[{train: a, weight: 1, val: b}]", "data.sources[1].val: unknown key; expected train or weight"},
      {"data.sources=[{train: a, weight: 1, weight: 2}]", "duplicate key"},
      {"data.sources=[]", "data.sources: got an empty list; expected a list of maps {train: GLOB, weight: W}"},
      {"data.sources=a_*.bin", "data.sources: got"},
      {"data.sources=[a_*.bin]", "data.sources[1]: got"},
      {"data.sources=[{train: a, weight: .nan}]", "data.sources[1].weight"},
      {"data.train=t_*.bin", "data.sources: given beside data.train; expected one of data.train (one glob) and "
                             "data.sources"},
      {"data.synthetic.vocab=64", "data.sources: cannot be combined with data.synthetic"},
  };
  for (const auto& [flag, expected] : bad) {
    CAPTURE(flag);
    const std::string message = only_problem(base + sources, {flag});
    CHECK(contains(message, expected));
  }
}
