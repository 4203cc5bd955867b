// ptrain's command line. Parsing only: every command calls into src/.
// Exit codes: 0 success, 2 bad input (config, data, flags), 1 anything else.
#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "config/config.h"
#include "core/error.h"
#include "core/format.h"
#include "data/prepare.h"
#include "data/synthetic.h"
#include "dist/communicator.h"
#include "train/bench.h"
#include "train/capacity_plan.h"
#include "optim/divergence_guard.h"
#include "train/compare_command.h"
#include "metrics/report.h"
#include "train/eval_command.h"
#include "train/export_command.h"
#include "train/inspect_command.h"
#include "train/output_policy.h"
#include "train/sample_command.h"
#include "train/trainer.h"

namespace {

constexpr int64_t kMaxWhole = INT64_MAX;

// A whole-number flag's range, checked on the text as given: a sign, a fraction, a leading zero
// (CLI11 would read 010 as octal 8) or a value outside [lo, hi] is refused naming the flag and
// the range (an unsigned flag would take -3 as 2^64 - 3, and CLI11's own range check prints a
// double's bounds).
CLI::Validator whole_number(int64_t lo, int64_t hi) {
  const std::string range = "a whole number from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        size_t used = 0;
        int64_t value = 0;
        try {
          value = std::stoll(text, &used, 10);
        } catch (const std::exception&) {
          used = 0;
        }
        const bool plain = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '-') &&
                           !(text.size() > 1 && text[0] == '0');
        if (!plain || used == 0 || used != text.size() || value < lo || value > hi)
          return text + "; expected " + range;
        return std::string();
      },
      std::to_string(lo) + ".." + std::to_string(hi));
}

// A real-number flag's range, checked on the text as given: not a number, not finite, or outside
// [lo, hi] is refused naming the flag and the range (the value shown as typed, never as a
// 309-digit expansion).
CLI::Validator real_number(double lo, double hi) {
  const std::string range = "a number from " + ptrain::number_text(lo) + " to " + ptrain::number_text(hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = text.empty() ? 0 : std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || value < lo || value > hi)
          return text + "; expected " + range;
        return std::string();
      },
      ptrain::number_text(lo) + ".." + ptrain::number_text(hi));
}

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;
constexpr int kExitRegressed = 3;  // ptrain compare --fail-on-regression
constexpr int kExitDiverged = 4;   // training.guard stopped the run

void add_train_command(CLI::App& app, std::string& config_path, std::vector<std::string>& overrides,
                       bool& dry_run, int& planned_ranks, std::string& fit, int64_t& stop_at) {
  CLI::App* cmd = app.add_subcommand("train", "Train a model from a YAML run config");
  cmd->footer(
      "Examples:\n"
      "  ptrain train configs/quickstart.yaml\n"
      "  ptrain train configs/quickstart.yaml --set training.steps=50 --set run.name=short\n"
      "  ptrain train run.yaml --dry-run        # validate, print the plan, write nothing\n"
      "  ptrain train run.yaml --dry-run --ranks 8   # the plan per rank of 8 data-parallel ranks\n"
      "  ptrain train run.yaml --dry-run --fit h100-80gb   # micro-batch and ranks that fit an H100\n"
      "  ptrain train run.yaml --set checkpoint.resume=auto   # continue from the newest checkpoint\n"
      "Ctrl-C (SIGINT) or SIGTERM stops after the current micro-batch, saves the last completed\n"
      "step and exits 0; a second signal exits at once (earlier checkpoints stay valid).\n"
      "Exit codes: 0 done, 2 bad input, 4 stopped by the divergence guard (training.guard), 1 other.");
  cmd->add_option("config", config_path, "YAML run config")->required();
  cmd->add_option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  CLI::Option* dry = cmd->add_flag("--dry-run", dry_run, "Validate, print the resolved config, parameters and memory, then exit");
  cmd->add_option("--ranks", planned_ranks,
                  "With --dry-run: plan this many data-parallel ranks (batch split, ZeRO shards, memory per rank) "
                  "without mpirun")
      ->check(whole_number(1, 65536))
      ->needs(dry);
  std::vector<std::string> gpus;
  for (const ptrain::GpuKind& g : ptrain::known_gpus()) gpus.push_back(g.key);
  cmd->add_option("--fit", fit,
                  "With --dry-run: plan what fits this GPU: the largest micro-batch, and the fewest ranks for each "
                  "ZeRO stage and recompute setting")
      ->check(CLI::IsMember(gpus))
      ->needs(dry);
  cmd->add_option("--stop-at", stop_at,
                  "Stop after this step with a checkpoint, as an interruption would (e.g. a job's time limit)")
      ->check(whole_number(1, kMaxWhole));
}

void add_bench_command(CLI::App& app, std::string& config_path, std::vector<std::string>& overrides, bool& profile) {
  CLI::App* cmd = app.add_subcommand("bench", "Benchmark training throughput against the machine's sgemm ceiling");
  cmd->footer(
      "Measures a 4096^3 sgemm through the same BLAS and thread count, trains the config for\n"
      "training.steps steps, and prints median ms/step, tokens/s and model FLOP/s over steps 2..N.\n"
      "Examples:\n"
      "  ptrain bench configs/bench-cpu.yaml\n"
      "  ptrain bench configs/bench-cpu.yaml --profile --set precision.mode=bf16");
  cmd->add_option("config", config_path, "YAML run config")->required();
  cmd->add_option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  cmd->add_flag("--profile", profile,
                "CPU: also print the median time per op family (GEMMs, attention, classifier, ...) and the GEMMs' rate");
}

struct CompareArgs {
  std::vector<std::string> inputs;  // one config, or run directories
  std::string modes;                // comma-separated
  bool fail_on_regression = false;
  double target_loss = 0;
  CLI::Option* target_option = nullptr;  // given: options.target_loss = target_loss
  ptrain::CompareOptions options;
};

void add_compare_command(CLI::App& app, std::vector<std::string>& overrides, CompareArgs& args) {
  CLI::App* cmd = app.add_subcommand("compare", "Train a config in several precision modes and report what each cost and bought");
  cmd->footer(
      "Trains CONFIG once per mode with the same seed and data order (reusing finished runs in\n"
      "OUT/runs), or reads finished RUN_DIRs, then writes OUT/report.md, OUT/report.html and SVG\n"
      "charts, led by a verdict in words: final train/val loss against the reference, the training\n"
      "time and tokens each mode needed to first reach the target val loss (--target-loss, default\n"
      "the reference's final val loss; interpolated between evaluations) and the speedup in it,\n"
      "the largest divergence along the curve,\n"
      "the gap to the oracle loss (synthetic data), tokens/s and speedup, peak memory, skipped\n"
      "steps, FP8 underflow and saturation, and a verdict per mode.\n"
      "Exit codes: 0 done, 2 bad input, 3 a mode regressed (with --fail-on-regression), 1 other.\n"
      "Examples:\n"
      "  ptrain compare configs/quickstart.yaml --modes fp32,bf16,fp8:delayed\n"
      "  ptrain compare runs/a runs/b --reference fp32 --out compare-ab --fail-on-regression");
  cmd->add_option("inputs", args.inputs, "A YAML run config, or two or more run directories")->required();
  cmd->add_option("--modes", args.modes,
                  "With a config: modes to train, e.g. fp32,bf16,fp16,fp8:delayed,fp8:current,fp8:block, an fp8 mode "
                  "with +primary (primary FP8 weights) and/or +codes (the MLP's input as FP8 codes), and precision "
                  "schedules: schedule (the config's own), schedule:fp8-then-bf16, schedule:bf16-then-fp8");
  cmd->add_option("--steps", args.options.steps, "With a config: override training.steps")
      ->check(whole_number(1, kMaxWhole));
  cmd->add_option("--out", args.options.out_dir, "Report directory (default: <out_dir>/compare-<run.name>, or compare-report)");
  cmd->add_flag("--force", args.options.force, "Replace the report of an earlier compare at --out");
  cmd->add_option("--reference", args.options.reference, "The mode the others are measured against (default: the first)");
  cmd->add_option("--tolerance", args.options.tolerance_pct,
                  "Largest |final val loss difference| in % of the reference's still within tolerance")
      ->check(real_number(0, 1000))
      ->capture_default_str();
  args.target_option = cmd->add_option(
      "--target-loss", args.target_loss,
      "Val loss that time-to-target measures to (default: the reference's final val loss)")
      ->check(real_number(1e-6, 1e6));
  cmd->add_flag("--int8-eval", args.options.int8_eval,
                "Also evaluate each run's final checkpoint with INT8 block-linear weights (eval --weights int8)");
  cmd->add_flag("--fail-on-regression", args.fail_on_regression, "Exit 3 when any mode is outside the tolerance");
  cmd->add_option("--set", overrides, "With a config: override a config key (repeatable)");
}

// Prints the report's table and where the report is; the exit code --fail-on-regression asks for.
int report_comparison(const ptrain::Comparison& c, const CompareArgs& args) {
  std::printf("%s\nreport: %s/report.md, %s/report.html\n", ptrain::report_markdown_summary(c).c_str(),
              args.options.out_dir.c_str(), args.options.out_dir.c_str());
  if (c.any_regressed()) std::printf("at least one mode is outside the tolerance of %g%%\n", c.tolerance_pct);
  return args.fail_on_regression && c.any_regressed() ? kExitRegressed : 0;
}

struct CheckpointArgs {
  std::string path;  // inspect
  std::string format = "llmc";  // export
  ptrain::HfExportOptions exported;
  std::string dump_logits;  // eval
  bool force_dump = false;  // eval --force
  std::string weights = "fp32";  // eval and sample: --weights
  ptrain::SampleOptions sample;
};

void add_checkpoint_commands(CLI::App& app, std::string& config_path, std::vector<std::string>& overrides,
                             CheckpointArgs& a) {
  CLI::App* eval = app.add_subcommand("eval", "Validation loss of a checkpoint on a config's val data");
  eval->footer("Example:\n  ptrain eval configs/quickstart.yaml --checkpoint runs/quickstart/checkpoints/step_00000150");
  eval->add_option("config", config_path, "YAML run config (its data and eval batches)")->required();
  eval->add_option("--checkpoint", a.sample.checkpoint, "Checkpoint directory")->required();
  eval->add_option("--set", overrides, "Override a config key: section.key=value (repeatable)");
  eval->add_option("--dump-logits", a.dump_logits,
                   "Also write the first val window's tokens and logits (JSON) to this file (a new one)");
  eval->add_flag("--force", a.force_dump, "Replace an earlier --dump-logits file");
  eval->add_option("--weights", a.weights,
                   "int8: also the val loss with the block linears' weights in INT8 (per output channel, "
                   "weight-only), and its difference to the fp32 masters'")
      ->capture_default_str();

  CLI::App* sample = app.add_subcommand("sample", "Generate text from a checkpoint (its run's tokenizer decodes)");
  sample->footer(
      "Deterministic for a given --seed. The tokenizer is the one the run's shards were made with\n"
      "(bytes or a BPE one); BPE samples stop at its document token (<|endoftext|>). A run on data with no known tokenizer\n"
      "(synthetic, llm.c shards without data.tokenizer) takes and prints token ids. A KV cache\n"
      "computes each new token alone while the text fits the model's context; past it the window\n"
      "slides over the last seq_len tokens, rerun whole for each token (positions are learned).\n"
      "Example:\n  ptrain sample --checkpoint runs/quickstart/checkpoints/step_00000600 --prompt \"Call me\" --tokens 200");
  sample->add_option("--checkpoint", a.sample.checkpoint, "Checkpoint directory")->required();
  sample->add_option("--prompt", a.sample.prompt, "Text to continue");
  sample->add_option("--tokens", a.sample.tokens, "Tokens to generate")
      ->check(whole_number(1, 1 << 20))
      ->capture_default_str();
  sample->add_option("--temperature", a.sample.temperature, "Softmax temperature; 0 = greedy")
      ->check(real_number(0, 1000))
      ->capture_default_str();
  sample->add_option("--top-k", a.sample.top_k, "Sample among the k most likely tokens; 0 = all")
      ->check(whole_number(0, INT32_MAX))
      ->capture_default_str();
  sample->add_option("--seed", a.sample.seed, "Seed of the draws")
      ->check(whole_number(0, kMaxWhole))
      ->capture_default_str();
  sample->add_option("--vocab", a.sample.vocabulary, "BPE tokenizers: the vocabulary the shards were made with, if not the default");
  sample->add_flag("--ignore-eot", a.sample.ignore_end_of_text, "Go on past <|endoftext|> instead of stopping");
  sample->add_flag("--no-kv-cache{false}", a.sample.kv_cache,
                   "Run the whole window for every token instead of the KV cache (same tokens, O(T) times the work)");
  sample->add_flag("--timing", a.sample.timing, "Print the generation's tokens/s on stderr");
  sample->add_option("--weights", a.weights,
                     "fp32 (the checkpoint's masters) or int8 (the block linears' weights in INT8, per output channel)")
      ->capture_default_str();

  CLI::App* inspect = app.add_subcommand("inspect", "Show what a checkpoint, safetensors or llm.c model file holds");
  inspect->footer("Example:\n  ptrain inspect runs/quickstart/checkpoints/step_00000150");
  inspect->add_option("path", a.path, "Checkpoint directory or file")->required();

  app.add_subcommand("devices", "Show the CUDA libraries ptrain loads and the GPUs it can use (no GPU needed)");

  CLI::App* exp = app.add_subcommand("export", "Write a checkpoint's weights as an llm.c model file or a Hugging Face model");
  exp->footer(
      "hf writes a directory that transformers' AutoModelForCausalLM.from_pretrained loads: config.json,\n"
      "model.safetensors (shards and an index above --max-shard-size) and, for GPT-2-tokenized data,\n"
      "vocab.json, merges.txt and tokenizer_config.json.\n"
      "Examples:\n  ptrain export --checkpoint runs/quickstart/checkpoints/step_00000150 --format llmc --out model.bin\n"
      "  ptrain export --checkpoint runs/quickstart/checkpoints/step_00000500 --format hf --out hf-model --dtype bf16");
  exp->add_option("--checkpoint", a.exported.checkpoint, "Checkpoint directory")->required();
  exp->add_option("--format", a.format, "llmc (a model file) or hf (a Hugging Face directory)")
      ->check(CLI::IsMember({"llmc", "hf"}))
      ->capture_default_str();
  exp->add_option("--out", a.exported.out, "Output file (llmc) or directory (hf)")->required();
  exp->add_option("--dtype", a.exported.dtype, "fp32, bf16 or (hf only) fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  exp->add_option("--max-shard-size", a.exported.max_shard_size, "hf: the largest safetensors file (5GB, 200MB, bytes)")
      ->capture_default_str();
  exp->add_flag("--force", a.exported.force, "Replace an earlier export of the same format at --out");
  exp->add_option("--vocab", a.exported.vocabulary, "hf, BPE tokenizers: the vocabulary the shards were made with, if not the default");
}

struct SynthArgs {
  std::string out;
  int vocab = 256, order = 2, branching = 4;
  int64_t tokens = 1000000, seed = 1;
  double val_fraction = 0.1;
  bool force = false;
};

void add_data_commands(CLI::App& app, SynthArgs& synth, ptrain::PrepareOptions& prepare, std::string& invalid_utf8,
                       ptrain::HfTokenizerExportOptions& hf_tokenizer) {
  CLI::App* data = app.add_subcommand("data", "Make training data: synthetic corpora, tokenized text, tokenizer files");
  data->require_subcommand(1);

  CLI::App* s = data->add_subcommand("synth", "Write a corpus drawn from a random sparse order-K Markov source");
  s->footer(
      "Writes DIR/train_000000.bin, DIR/val_000000.bin (llm.c token shards: uint16 ids, uint32 past a\n"
      "vocabulary of 65,536) and DIR/synthetic.json with the source's parameters and the oracle loss\n"
      "of the val split: the floor no model can beat.\n"
      "Example:\n"
      "  ptrain data synth --out data/markov --vocab 256 --order 2 --tokens 2000000 --seed 7");
  s->add_option("--out", synth.out, "Output directory: new or empty")->required();
  s->add_flag("--force", synth.force, "Replace a corpus data synth wrote at --out earlier");
  s->add_option("--vocab", synth.vocab, "Vocabulary size V (above 65,536: uint32 shards)")
      ->check(whole_number(2, ptrain::kMaxVocab))
      ->capture_default_str();
  s->add_option("--order", synth.order, "Context length K of the source")
      ->check(whole_number(1, INT32_MAX))
      ->capture_default_str();
  s->add_option("--branching", synth.branching, "Successor tokens allowed per context")
      ->check(whole_number(1, ptrain::kMaxVocab))
      ->capture_default_str();
  s->add_option("--tokens", synth.tokens, "Tokens in total (train + val)")
      ->check(whole_number(1, kMaxWhole))
      ->capture_default_str();
  s->add_option("--seed", synth.seed, "Seed of the source and the sample")
      ->check(whole_number(0, kMaxWhole))
      ->capture_default_str();
  s->add_option("--val-fraction", synth.val_fraction, "Share of tokens in the val split")
      ->check(real_number(0, 1))
      ->capture_default_str();

  CLI::App* p = data->add_subcommand("prepare", "Tokenize text files (byte-level BPE or bytes) into llm.c token shards");
  p->footer(
      "Each file is a document (or each part between --separator strings); with a BPE tokenizer, its\n"
      "document token (<|endoftext|>, Llama 3's <|begin_of_text|>) precedes every document, as llm.c's\n"
      "data scripts do. The last tokens are the val split.\n"
      "Writes DIR/NAME_val_000000.bin, DIR/NAME_train_000000.bin, ... (NAME: DIR's base name, as\n"
      "llm.c names its shards) and DIR/ptrain-tokenizer.json, which train checks against the config.\n"
      "Examples:\n"
      "  ptrain data prepare --input ~/.cache/ptrain/text/moby-dick.txt --out data/moby --tokenizer bytes\n"
      "  ptrain data prepare --input ~/.cache/ptrain/text/sotu --out data/sotu --val-tokens 100000");
  p->add_option("--input", prepare.inputs, "Text files and directories (their files, sorted), in order")->required();
  p->add_option("--out", prepare.out_dir, "Output directory: new or empty")->required();
  p->add_option("--tokenizer", prepare.tokenizer,
                "gpt2, cl100k_base or o200k_base (each exact to tiktoken's encoding of that name), llama3 or "
                "hf (exact to Hugging Face's tokenizers on Llama 3's tokenizer.json, or on the one --vocab "
                "names), or bytes")
      ->check(CLI::IsMember(ptrain::tokenizer_name_list()))
      ->capture_default_str();
  p->add_option("--vocab", prepare.vocabulary,
                "The tokenizer's file: a .tiktoken file (gpt2, cl100k_base, o200k_base), a directory with "
                "vocab.json and merges.txt (gpt2), a tokenizer.json (llama3, hf; required for hf). Default: the "
                "one scripts/fetch-data.sh fetched into ~/.cache/ptrain");
  auto* fraction = p->add_option("--val-fraction", prepare.val_fraction, "Share of tokens in the val split")
                       ->capture_default_str();
  p->add_option("--val-tokens", prepare.val_tokens, "Tokens in the val split (instead of --val-fraction)")
      ->check(whole_number(1, kMaxWhole))
      ->excludes(fraction);
  p->add_option("--shard-tokens", prepare.shard_tokens, "Tokens per shard at most")
      ->check(whole_number(1, INT32_MAX))
      ->capture_default_str();
  p->add_option("--threads", prepare.threads, "Threads tokenizing; 0 = all cores")
      ->check(whole_number(0, ptrain::kMaxPrepareThreads))
      ->capture_default_str();
  p->add_option("--separator", prepare.separator, "Cut files into documents at this string (e.g. a line of ===)");
  p->add_option("--invalid-utf8", invalid_utf8,
                "gpt2: error (name the file and byte offset) or replace (U+FFFD, as Python's errors=\"replace\")")
      ->check(CLI::IsMember({"error", "replace"}))
      ->capture_default_str();

  CLI::App* h = data->add_subcommand("hf-tokenizer", "Write a tokenizer's Hugging Face files (tokenizer.json and its configs)");
  h->footer(
      "Writes DIR/tokenizer.json, tokenizer_config.json and special_tokens_map.json (gpt2: also vocab.json and\n"
      "merges.txt), as export --format hf does for a model: Hugging Face's tokenizers loads them and encodes\n"
      "as ptrain does (a tiktoken encoding becomes byte-level BPE with its pattern and merges).\n"
      "Example:\n"
      "  ptrain data hf-tokenizer --tokenizer o200k_base --out o200k-hf");
  h->add_option("--tokenizer", hf_tokenizer.tokenizer, "One of " + ptrain::tokenizer_names())
      ->check(CLI::IsMember(ptrain::tokenizer_name_list()))
      ->required();
  h->add_option("--vocab", hf_tokenizer.vocabulary, "The tokenizer's file, as data prepare --vocab takes it");
  h->add_option("--out", hf_tokenizer.out, "Output directory: new or empty")->required();
  h->add_option("--max-length", hf_tokenizer.model_max_length, "model_max_length in tokenizer_config.json")
      ->check(whole_number(1, INT32_MAX));
  h->add_flag("--force", hf_tokenizer.force, "Replace what data hf-tokenizer wrote at --out earlier");
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::string part;
  for (const char ch : text + ",") {
    if (ch != ',') {
      part += ch;
    } else if (!part.empty()) {
      parts.push_back(part);
      part.clear();
    }
  }
  return parts;
}

int run(int argc, char** argv) {
  CLI::App app{"ptrain: pre-train GPT-style language models in FP32, BF16, FP16 with loss scaling, or FP8"};
  app.set_version_flag("--version", std::string("ptrain ") + PTRAIN_VERSION);
  app.require_subcommand(1);
  app.footer(
      "Examples:\n"
      "  ptrain train configs/quickstart.yaml\n"
      "  ptrain data synth --out data/markov --tokens 2000000\n"
      "  ptrain data prepare --input notes.txt --out data/notes --tokenizer gpt2\n"
      "  ptrain bench configs/bench-cpu.yaml\n"
      "  ptrain compare configs/quickstart.yaml --modes fp32,bf16,fp8:delayed\n"
      "Run 'ptrain COMMAND --help' for a command's options.");

  std::string config_path;
  std::vector<std::string> overrides;
  bool dry_run = false;
  int planned_ranks = 0;
  std::string fit;
  int64_t stop_at = 0;
  add_train_command(app, config_path, overrides, dry_run, planned_ranks, fit, stop_at);
  bool bench_profile = false;
  add_bench_command(app, config_path, overrides, bench_profile);
  CheckpointArgs ckpt;
  add_checkpoint_commands(app, config_path, overrides, ckpt);
  SynthArgs synth;
  ptrain::PrepareOptions prepare;
  std::string invalid_utf8 = "error";
  ptrain::HfTokenizerExportOptions hf_tokenizer;
  add_data_commands(app, synth, prepare, invalid_utf8, hf_tokenizer);
  CompareArgs compare;
  add_compare_command(app, overrides, compare);

  // CLI11 reports a mistyped command only as "A subcommand is required": name it instead.
  const std::string first = argc > 1 ? argv[1] : "";
  const std::vector<std::string> commands = {"train", "eval",    "sample", "inspect", "export",
                                             "bench", "compare", "data",   "devices"};
  if (!first.empty() && first[0] != '-' && std::find(commands.begin(), commands.end(), first) == commands.end()) {
    std::fprintf(stderr,
                 "ptrain: error: unknown command \"%s\"; expected train, eval, sample, inspect, export, bench, compare, data or devices "
                 "(see ptrain --help)\n",
                 first.c_str());
    return kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitBadInput;
  }

  if (app.got_subcommand("train")) {
    const ptrain::Config config = ptrain::load_config(config_path, overrides);
    ptrain::train(config, ptrain::TrainOptions{dry_run, planned_ranks, stop_at, nullptr, fit});
    return 0;
  }
  if (app.got_subcommand("eval")) {
    const ptrain::WeightFormat weights = ptrain::parse_weight_format(ckpt.weights);
    ptrain::eval_checkpoint(ptrain::load_config(config_path, overrides), ckpt.sample.checkpoint, ckpt.dump_logits,
                            weights, ckpt.force_dump);
    return 0;
  }
  if (app.got_subcommand("sample")) {
    ckpt.sample.weights = ptrain::parse_weight_format(ckpt.weights);
    ptrain::sample(ckpt.sample);
    return 0;
  }
  if (app.got_subcommand("inspect")) {
    ptrain::inspect(ckpt.path);
    return 0;
  }
  if (app.got_subcommand("devices")) {
    std::fputs(ptrain::describe_devices().c_str(), stdout);
    return 0;
  }
  if (app.got_subcommand("export")) {
    if (ckpt.format == "hf") {
      ptrain::export_hf(ckpt.exported);
    } else {
      const ptrain::HfExportOptions defaults;
      if (ckpt.exported.max_shard_size != defaults.max_shard_size || !ckpt.exported.vocabulary.empty())
        throw ptrain::UserError("--max-shard-size and --vocab apply to --format hf; expected neither with llmc");
      ptrain::export_llmc(ckpt.exported.checkpoint, ckpt.exported.out, ckpt.exported.dtype, ckpt.exported.force);
    }
    return 0;
  }
  if (app.got_subcommand("compare")) {
    if (compare.target_option->count() > 0) compare.options.target_loss = compare.target_loss;
    const bool one_config = compare.inputs.size() == 1 && !std::filesystem::is_directory(compare.inputs[0]);
    if (one_config) {
      const ptrain::Config base = ptrain::load_config(compare.inputs[0], overrides);
      if (compare.options.out_dir.empty())
        compare.options.out_dir = (std::filesystem::path(base.run.out_dir) / ("compare-" + base.run.name)).string();
      compare.options.modes = split_commas(compare.modes);
      return report_comparison(ptrain::compare_modes(base, compare.options), compare);
    }
    if (!compare.modes.empty() || compare.options.steps > 0 || !overrides.empty())
      throw ptrain::UserError("compare: --modes, --steps and --set go with a config, not with run directories");
    if (compare.options.out_dir.empty()) compare.options.out_dir = "compare-report";
    return report_comparison(ptrain::compare_run_dirs(compare.inputs, compare.options), compare);
  }
  if (app.got_subcommand("bench")) {
    ptrain::benchmark(ptrain::load_config(config_path, overrides), bench_profile);
    return 0;
  }
  CLI::App* data = app.get_subcommand("data");
  if (data->got_subcommand("synth")) {
    const std::string target = ptrain::plan_output(
        synth.out, ptrain::OutputRule{"--out", true, "ptrain data synth", synth.force, [](const std::filesystem::path& p) {
                                        return ptrain::holds_only_synthetic_corpus(p.string());
                                      }});
    const ptrain::SyntheticInfo info = ptrain::generate_synthetic(
        {synth.vocab, synth.order, synth.branching, synth.tokens, static_cast<uint64_t>(synth.seed), synth.val_fraction},
        target, ptrain::SpecSource::flags);
    std::printf("wrote %lld train + %lld val tokens to %s\noracle loss: train %.6f, val %.6f (ln V = %.6f)\n",
                static_cast<long long>(info.train_tokens), static_cast<long long>(info.val_tokens), synth.out.c_str(),
                info.oracle_loss_train, info.oracle_loss_val, std::log(static_cast<double>(synth.vocab)));
    return 0;
  }
  if (data->got_subcommand("hf-tokenizer")) {
    ptrain::export_hf_tokenizer(hf_tokenizer);
    return 0;
  }
  prepare.out_dir = ptrain::plan_outside_owned_directories(prepare.out_dir, "--out");
  prepare.replace_invalid_utf8 = invalid_utf8 == "replace";
  prepare.progress = ::isatty(STDERR_FILENO) != 0;
  const ptrain::PrepareResult r = ptrain::prepare_text(prepare);
  std::printf("%s: %lld documents, %.1f MB -> %lld train + %lld val tokens in %zu shard(s) in %s (%.1f MB/s)\n",
              prepare.tokenizer.c_str(), static_cast<long long>(r.documents), r.input_bytes / 1e6,
              static_cast<long long>(r.train_tokens), static_cast<long long>(r.val_tokens), r.files.size(),
              prepare.out_dir.c_str(), r.seconds > 0 ? r.input_bytes / 1e6 / r.seconds : 0.0);
  return 0;
}

// Under an MPI launcher a failing rank names itself and takes the job down (MPI_Abort), so no
// other rank waits forever in a collective.
int fail(const char* kind, const char* what, int code) {
  const int world = ptrain::launcher_world_size();
  if (world > 1)
    std::fprintf(stderr, "ptrain: %s on rank %d of %d: %s\n", kind, ptrain::launcher_rank(), world, what);
  else
    std::fprintf(stderr, "ptrain: %s: %s\n", kind, what);
  std::fflush(stderr);
  ptrain::abort_other_ranks(code);
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  // A file-size limit (ulimit -f) then fails the write with EFBIG, which names the file, instead
  // of killing the process with SIGXFSZ halfway through a save.
  std::signal(SIGXFSZ, SIG_IGN);
  // A closed standard output (`ptrain train run.yaml | head -1`) must not kill a run: writes to
  // it fail with EPIPE instead, which the console sink ignores; log.txt and metrics.jsonl go on.
  std::signal(SIGPIPE, SIG_IGN);
  // Each token shard stays open while a run reads it: a corpus of thousands of shards needs more
  // descriptors than the usual soft limit of 1024, so take what the hard limit allows.
  struct rlimit files {};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
  try {
    ptrain::gemm_ulp_seed();  // the tests' second numerics: a malformed seed is bad input (exit 2)
    return run(argc, argv);
  } catch (const ptrain::UserError& e) {
    return fail("error", e.what(), kExitBadInput);
  } catch (const ptrain::EnvironmentError& e) {
    return fail("error", e.what(), kExitFailure);
  } catch (const ptrain::DivergedError& e) {
    return fail("error", e.what(), kExitDiverged);
  } catch (const std::exception& e) {
    return fail("internal error", e.what(), kExitFailure);
  }
}
