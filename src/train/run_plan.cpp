#include "train/run_plan.h"

#include <algorithm>
#include <omp.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "backend/device.h"
#include "checkpoint/hf_directory.h"
#include "core/error.h"
#include "core/format.h"
#include "core/paths.h"
#include "data/dataset.h"
#include "data/tokenizer_record.h"
#include "dist/communicator.h"
#include "metrics/run_log.h"
#include "model/transformer.h"
#include "optim/adamw.h"
#include "train/output_policy.h"
#include "train/trainer.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

// The longest name ptrain writes below a run directory, e.g.
// "checkpoints/.step_00000001.tmp/optimizer.rank00001-of-00002.safetensors.tmp".
constexpr size_t kLongestInnerPath = 96;
constexpr const char* kRunDirWhat = "run directory (run.out_dir / run.name)";
// Micro-batches per optimizer step and rank: far beyond any useful run, and within an int.
constexpr int64_t kMaxAccumulation = 1 << 20;

std::string in_quotes(const std::string& s) { return "\"" + s + "\""; }

bool has_run_marker(const std::string& dir) { return path_kind((fs::path(dir) / kRunMarker).string(), kRunDirWhat) != PathKind::missing; }

// The synthetic corpus is generated inside the run directory, so its split sizes are checked
// arithmetically (the same split rule as generate_synthetic) before anything is written.
void check_synthetic_split_sizes(const SyntheticDataConfig& s, int eval_batches, int B, int T) {
  const int64_t train_tokens = std::llround((1.0 - s.val_fraction) * static_cast<double>(s.tokens));
  const int64_t val_tokens = s.tokens - train_tokens;
  const int64_t val_needed = int64_t{eval_batches} * B * T + 1;
  std::vector<std::string> problems;
  if (train_tokens < T + 1)
    problems.push_back("data.synthetic.tokens: the train split would hold " + std::to_string(train_tokens) +
                       " tokens; expected at least " + std::to_string(T + 1) + " (one window of seq_len + 1)");
  if (val_tokens < val_needed)
    problems.push_back("data.synthetic: the val split would hold " + std::to_string(val_tokens) +
                       " tokens; expected at least " + std::to_string(val_needed) +
                       " (training.eval_batches x micro_batch x seq_len + 1): raise data.synthetic.tokens or "
                       "val_fraction, or lower training.eval_batches");
  if (!problems.empty()) throw UserErrors(problems);
}

// The shards' tokenizer, loaded (gpt2 from data.vocab's files) when the samples train prints
// need it or data.vocab is to be checked against the shards' record, and the sample prompt
// encoded: a missing vocabulary, the wrong one, or a prompt that is not UTF-8 stops the run
// before anything is written.
void plan_samples(const Config& config, DataPlan& data, std::vector<std::string>& warnings) {
  const LoggingConfig& log = config.logging;
  const std::string& vocab = config.data.vocab;
  if (!vocab.empty() && (data.tokenizer.empty() || data.tokenizer == "bytes"))
    throw UserError("data.vocab: " + in_quotes(vocab) + " is given, but only BPE shards take a vocabulary and "
                    "these shards' tokenizer is " +
                    (data.tokenizer.empty() ? std::string("not known") : data.tokenizer) +
                    "; expected data.vocab only with shards of a BPE tokenizer (" + tokenizer_names() + ", less bytes)");
  if (log.sample_every == 0 && vocab.empty()) return;
  if (!data.tokenizer.empty()) {
    const Tokenizer tokenizer = Tokenizer::load(data.tokenizer, vocab);
    const std::string shard_dir = fs::path(data.train_files.front()).parent_path().string();
    const std::optional<TokenizerRecord> record = read_tokenizer_record(shard_dir);
    if (record && record->vocabulary_sha256 != tokenizer.vocabulary_sha256()) {
      if (!vocab.empty())
        throw UserError("data.vocab: " + vocab + " is not the vocabulary the shards in " + shard_dir +
                        " were made with (their " + kTokenizerRecord + " records SHA-256 " +
                        record->vocabulary_sha256 + ", these files hash to " + tokenizer.vocabulary_sha256() +
                        "); expected the vocabulary given to data prepare --vocab");
      warnings.push_back("logging.sample_every: the shards were made with another " + data.tokenizer +
                         " vocabulary than the default one, so samples print token ids (data.vocab names "
                         "the files they were made with)");
    } else if (tokenizer.vocab_size() > config.model.vocab_size) {
      throw UserError("model.vocab_size is " + std::to_string(config.model.vocab_size) + ", below the " +
                      data.tokenizer + " tokenizer's " + std::to_string(tokenizer.vocab_size()) +
                      " tokens; expected model.vocab_size: " + std::to_string(tokenizer.vocab_size()) + " or more");
    } else if (log.sample_every > 0) {
      data.sample_tokenizer = tokenizer;
    }
  }
  if (log.sample_every == 0 || log.sample_prompt.empty()) return;
  if (!data.sample_tokenizer)
    throw UserError("logging.sample_prompt: the shards' tokenizer is not known here, so the prompt cannot be "
                    "encoded; expected data.tokenizer: " + tokenizer_names() + " (with data.vocab if the shards "
                    "were not made with the default vocabulary), or no sample_prompt (samples then print token ids)");
  for (const uint32_t id : data.sample_tokenizer->encode(log.sample_prompt, "logging.sample_prompt"))
    data.sample_prompt.push_back(static_cast<int32_t>(id));
}

DataPlan plan_data(const Config& config, const std::string& run_dir, std::vector<std::string>& warnings) {
  DataPlan data;
  const int B = config.training.micro_batch, T = config.training.effective_seq_len(config.model);
  if (config.data.synthetic_enabled) {
    const auto& s = config.data.synthetic;
    check_synthetic_split_sizes(s, config.training.eval_batches, B, T);
    data.synthetic = SyntheticSpec{s.vocab, s.order, s.branching, s.tokens, static_cast<uint64_t>(s.seed), s.val_fraction};
    const std::vector<std::string> problems = synthetic_spec_problems(*data.synthetic);
    if (!problems.empty()) throw UserErrors(problems);
    const std::string dir = (fs::path(run_dir) / "data").string();
    data.train_files = {synthetic_train_file(dir)};
    data.sources = {{"data.train", data.train_files.front(), 1, data.train_files}};
    data.val_files = {synthetic_val_file(dir)};
    plan_samples(config, data, warnings);
    return data;
  }
  if (config.data.sources.empty())
    data.sources.push_back({"data.train", config.data.train, 1, expand_shard_glob(config.data.train, "data.train")});
  for (size_t i = 0; i < config.data.sources.size(); ++i) {
    const DataSource& source = config.data.sources[i];
    const std::string key = "data.sources[" + std::to_string(i + 1) + "].train";
    data.sources.push_back({key, source.train, source.weight, expand_shard_glob(source.train, key)});
  }
  for (const TrainSource& source : data.sources)
    data.train_files.insert(data.train_files.end(), source.files.begin(), source.files.end());
  data.val_files = expand_shard_glob(config.data.val, "data.val");
  const ShardTokenizer made_by = resolve_shard_tokenizer(data.train_files, data.val_files, config.data.tokenizer,
                                                         config.model.vocab_size, warnings);
  data.tokenizer = made_by.tokenizer;
  data.vocabulary_sha256 = made_by.vocabulary_sha256;
  plan_samples(config, data, warnings);
  data.open_train(config.model.vocab_size);
  data.train_sampler(0, T);  // every source holds a window
  const TokenStream& val = data.val.emplace(data.val_files, "data.val", config.model.vocab_size);
  const TokenStream& train = data.train.front();
  if (&val.format() != &train.format())
    throw UserError("data.val: \"" + data.val_files.front() + "\" is in " + val.format().name + " but " + train.key() +
                    "'s \"" + train.files().front() + "\" is in " + train.format().name +
                    "; expected both splits made with one vocabulary, in one format");
  const ValSampler val_batches(val, "data.val", config.training.eval_batches, B, T);
  // The evaluation reads only these windows: their token ids are checked now, cheaply, so that
  // the step-0 evaluation cannot fail after the run directory is made.
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  for (int j = 0; j < val_batches.batches(); ++j) val_batches.fill(j, inputs.data(), targets.data());
  const std::string val_dir = fs::path(data.val_files.front()).parent_path().string();
  data.info = read_synthetic_info(val_dir.empty() ? "." : val_dir);
  return data;
}

// What happens to <out_dir>/<name>. An existing directory is replaced only with run.overwrite
// and only if ptrain made it (it holds the marker) or it is empty, so a typo can never delete
// user files; it is continued by a resume only if ptrain made it.
RunDirAction plan_run_dir(const Config& config, const std::string& run_dir, bool continuing) {
  // Not inside a checkpoint or another run directory, which keep_last or run.overwrite delete whole.
  for (const OwnedDirectory& owner : enclosing_owned_directories(run_dir, true))
    if (owner.kind == "the checkpoint" || owner.kind == "the run directory")
      throw UserError(std::string(kRunDirWhat) + ": " + in_quotes(run_dir) + " is inside " + owner.kind + " " +
                      in_quotes(owner.dir.string()) + ", which could be deleted with it; expected a run.out_dir "
                      "outside checkpoints and other runs");
  const PathKind kind = path_kind(run_dir, kRunDirWhat);
  if (kind == PathKind::missing) {
    check_creatable(run_dir, kRunDirWhat, kLongestInnerPath);
    return RunDirAction::create;
  }
  if (kind == PathKind::file || kind == PathKind::other)
    throw UserError(std::string(kRunDirWhat) + ": " + in_quotes(run_dir) +
                    " exists and is not a directory; expected a new run.name or run.out_dir");
  check_creatable(run_dir, kRunDirWhat, kLongestInnerPath);  // names and a writable location
  if (continuing && has_run_marker(run_dir)) return RunDirAction::continue_run;
  if (!config.run.overwrite)
    throw UserError("run directory " + run_dir +
                    " already exists; expected a new run.name, or run.overwrite: true to replace it");
  if (!has_run_marker(run_dir) && !is_empty_directory(run_dir))
    throw UserError("run.overwrite: " + run_dir + " was not made by ptrain (no " + std::string(kRunMarker) +
                    " marker); refusing to delete it; expected a ptrain run directory or a new run.name");
  // Replacing deletes the directory from its parent: that must be writable too.
  const fs::path parent = fs::absolute(run_dir).lexically_normal().parent_path();
  check_writable_dir(parent.string(), "run.overwrite");
  return RunDirAction::replace;
}

// A checkpoint directory belongs to one run. The default one lives inside the run directory
// and shares its fate; an explicit checkpoint.dir records its owner and refuses other runs.
// First where it is and whose (before resume: auto searches it)...
void locate_checkpoint_dir(RunPlan& plan) {
  const Config& c = plan.config;
  plan.checkpoint_dir_is_explicit = !c.checkpoint.dir.empty();
  plan.checkpoint_dir =
      plan.checkpoint_dir_is_explicit ? c.checkpoint.dir : (fs::path(plan.run_dir) / "checkpoints").string();
  const std::string what = plan.checkpoint_dir_is_explicit ? "checkpoint.dir" : kRunDirWhat;
  const PathKind kind = path_kind(plan.checkpoint_dir, what);
  if (kind == PathKind::file || kind == PathKind::other)
    throw UserError(what + ": " + in_quotes(plan.checkpoint_dir) + " exists and is not a directory; expected a directory "
                    "for checkpoints (or null for <run dir>/checkpoints)");
  check_creatable(plan.checkpoint_dir, what, kLongestInnerPath);
  // `latest` is replaced at every save by renaming a new file over it, which replaces a file or
  // a link (even a broken one) but not a directory: found now, not at the first save.
  const fs::path latest = fs::path(plan.checkpoint_dir) / "latest";
  std::error_code ec;
  if (kind == PathKind::directory && fs::symlink_status(latest, ec).type() == fs::file_type::directory)
    throw UserError(what + ": " + in_quotes(latest.string()) + " is a directory; expected the file ptrain writes there "
                    "to name the newest checkpoint (move the directory away)");
  if (!plan.checkpoint_dir_is_explicit) return;
  const fs::path me = fs::weakly_canonical(plan.run_dir);
  if (kind == PathKind::directory) {
    std::optional<std::string> owner = checkpoint_dir_owner(plan.checkpoint_dir);
    // Directories from before owners were recorded: one inside another run's directory is that run's.
    const fs::path parent = fs::weakly_canonical(plan.checkpoint_dir).parent_path();
    if (!owner && has_run_marker(parent.string())) owner = parent.string();
    if (owner && *owner != me.string())
      throw UserError("checkpoint.dir: " + in_quotes(plan.checkpoint_dir) + " belongs to the run in " +
                      in_quotes(*owner) + "; expected a checkpoint directory of this run's own (or an empty one)");
  }
  // Nowhere inside a checkpoint, another run's checkpoints or the data (this run's directory is fine)...
  for (const OwnedDirectory& above : enclosing_owned_directories(plan.checkpoint_dir, true))
    if (above.kind != "the run directory" || above.dir != me)
      throw UserError("checkpoint.dir: " + in_quotes(plan.checkpoint_dir) + " is inside " + above.kind + " " +
                      in_quotes(above.dir.string()) + "; expected a directory outside checkpoints, other runs and "
                      "the data");
  if (kind == PathKind::missing) return;
  // ...and when it exists, empty or a checkpoint directory: never a directory of other files.
  const std::optional<std::string> found = owned_directory_kind(plan.checkpoint_dir);
  if (found ? *found != "the checkpoint directory" : !is_empty_directory(plan.checkpoint_dir))
    throw UserError("checkpoint.dir: " + in_quotes(plan.checkpoint_dir) + " is " +
                    (found ? *found : std::string("a directory of other files")) +
                    ", not a checkpoint directory; expected a new or empty directory, or this run's checkpoint directory");
}

// ...then, once the run directory's fate is known, what may happen to checkpoints already there.
void settle_checkpoint_dir(RunPlan& plan, bool continuing) {
  if (!plan.checkpoint_dir_is_explicit || path_kind(plan.checkpoint_dir, "checkpoint.dir") == PathKind::missing ||
      !holds_checkpoints(plan.checkpoint_dir))
    return;
  const bool owned = checkpoint_dir_owner(plan.checkpoint_dir).has_value();  // by this run: others were refused
  if (owned && plan.config.run.overwrite && plan.run_dir_action != RunDirAction::continue_run) {
    // The checkpoints of the run being replaced (its directory may already be gone).
    if (plan.resume)
      throw UserError("checkpoint.resume: " + plan.resume->path + " is in " + plan.checkpoint_dir +
                      ", whose checkpoints run.overwrite would remove; expected run.overwrite: false to resume");
    plan.clear_checkpoint_dir = true;
    return;
  }
  if (continuing) return;  // resuming this run (a directory from before owners were recorded too)
  throw UserError("checkpoint.dir: " + in_quotes(plan.checkpoint_dir) + " holds checkpoints of " +
                  (owned ? "an earlier run named " + plan.config.run.name : std::string("another run")) +
                  "; a new run would overwrite them; expected checkpoint.resume: auto to continue it, " +
                  (owned ? "run.overwrite: true to replace it, " : "") + "or another checkpoint.dir");
}

void plan_resume(RunPlan& plan) {
  const Config& c = plan.config;
  if (c.checkpoint.resume_never()) return;
  if (c.checkpoint.resume_auto()) {
    if (path_kind(plan.checkpoint_dir, "checkpoint.dir") != PathKind::directory) return;
    plan.resume = find_latest_checkpoint(plan.checkpoint_dir, [&](const std::string& w) { plan.resume_warnings.push_back(w); });
    // Starting afresh in place: the unusable checkpoints are set aside, never overwritten.
    if (!plan.resume) plan.superseded = checkpoints_after(plan.checkpoint_dir, -1);
  } else {
    try {
      plan.resume = load_checkpoint(c.checkpoint.resume);
    } catch (const UserError& e) {
      throw UserError(std::string("checkpoint.resume: ") + e.what());
    }
  }
  if (!plan.resume) return;
  const auto differences = model_differences(plan.resume->state.model, model_json(c.model));
  if (!differences.empty()) {
    std::vector<std::string> problems;
    for (const auto& d : differences)
      problems.push_back("checkpoint.resume: " + plan.resume->path + " has another model shape: " + d);
    throw UserErrors(problems);
  }
}

// A checkpoint saved in the guard's bf16 fallback resumes in it, whatever training.guard.action
// is now: its blocks run bf16 until the fallback ends, so the model keeps bf16 copies of its
// weights and of its linears' inputs, which primary FP8 weights do not.
void resume_into_fallback(RunPlan& plan) {
  if (!plan.resume) return;
  const DivergenceGuard::Rollback& rollback = plan.resume->state.guard.rollback;
  if (!rollback.in_fallback(plan.resume->state.step + 1)) return;
  if (plan.spec.precision.phases.front().policy.fp8.primary_weights)
    throw UserError("precision.fp8.primary_weights: true, but " + plan.resume->path +
                    " was saved in the guard's bf16 fallback (" +
                    (rollback.fallback_last < 0 ? std::string("to the end of the run")
                                                : "to step " + std::to_string(rollback.fallback_last)) +
                    "), whose blocks run in bf16 and need their weights' bf16 copies; expected false, or a "
                    "checkpoint from outside the fallback");
  if (plan.spec.precision.phases.front().policy.fp8.mlp_input_codes)
    throw UserError("precision.fp8.mlp_input_codes: true, but " + plan.resume->path +
                    " was saved in the guard's bf16 fallback, whose blocks run in bf16 and keep their MLP input in "
                    "bf16; expected false, or a checkpoint from outside the fallback");
  // The end of the fallback switches precision in place, which a precision.schedule's switch
  // shows is not implemented with sharded parameters (check_config refuses that one).
  const int64_t last = rollback.fallback_last;
  if (plan.config.distributed.zero_stage == 3 && last >= 0 && last < plan.config.training.steps)
    throw UserError("distributed.zero_stage: 3, but " + plan.resume->path +
                    " was saved in the guard's bf16 fallback, which ends at step " + std::to_string(last) +
                    " with a switch of precision in place: with sharded parameters that is not implemented; expected "
                    "distributed.zero_stage 2 or lower, or a checkpoint from outside the fallback");
  plan.spec.fp8_throughout = false;
}

void plan_init_from(RunPlan& plan) {
  const Config& c = plan.config;
  if (c.model.init_from.empty()) return;
  if (plan.resume) {
    // The checkpoint's weights continue the run; init_from only ever starts one.
    plan.warnings.push_back("model.init_from: " + in_quotes(c.model.init_from) + " is not used: the run resumes from " +
                            plan.resume->path + ", whose weights it continues");
    return;
  }
  if (path_kind(c.model.init_from, "model.init_from") == PathKind::directory) {
    HfWeights hf = read_hf_directory(c.model.init_from, c.model, "model.init_from");
    std::string source = "Hugging Face " + std::string(choice_name(c.model.arch)) + " directory, " + std::to_string(hf.files.size()) +
                         " safetensors file" + (hf.files.size() == 1 ? "" : "s");
    if (!hf.skipped.empty()) source += ", " + std::to_string(hf.skipped.size()) + " attention-mask buffers skipped";
    if (!hf.ignored.empty()) {
      source += "; config.json keys ignored:";
      for (const auto& key : hf.ignored) source += " " + key;
    }
    plan.init_from = InitWeights{std::move(hf.params), source};
    return;
  }
  if (c.model.arch != Arch::gpt2)
    throw UserError("model.init_from: \"" + c.model.init_from + "\" would be an llm.c model file, which holds GPT-2 " +
                    "weights only, and model.arch is " + choice_name(c.model.arch) +
                    "; expected a Hugging Face model directory or model.init_from: null");
  LlmcModel file = read_llmc(c.model.init_from, "model.init_from");
  const auto mismatches = llmc_mismatches(file, c.model);
  if (!mismatches.empty()) {
    std::vector<std::string> problems;
    for (const auto& m : mismatches) problems.push_back("model.init_from: \"" + c.model.init_from + "\": " + m);
    throw UserErrors(problems);
  }
  plan.init_from = InitWeights{std::move(file.params), "llm.c model file, version " + std::to_string(file.version)};
}

void plan_machine(RunPlan& plan, int planned_ranks) {
  const Config& c = plan.config;
  // More threads than cores only slows a run down (the results do not depend on the count).
  const int cores = omp_get_num_procs();
  plan.threads = c.training.threads;
  if (plan.threads > cores) {
    plan.warnings.push_back("training.threads: " + std::to_string(plan.threads) + " is more than the " +
                            std::to_string(cores) + " cores available; using " + std::to_string(cores));
    plan.threads = cores;
  }
  plan.world_size = launcher_world_size();
  if (planned_ranks > 0) {
    if (plan.world_size > 1)
      throw UserError("--ranks: " + std::to_string(planned_ranks) + " ranks planned inside a launch of " +
                      std::to_string(plan.world_size) + "; expected --ranks without mpirun (one process plans them all)");
    plan.world_size = planned_ranks;
  }
  const int64_t B = c.training.micro_batch, T = c.training.effective_seq_len(c.model);
  const int64_t per_rank = B * T * plan.world_size;
  if (c.training.batch_tokens % per_rank != 0)
    throw UserError("training.batch_tokens: " + std::to_string(c.training.batch_tokens) + " tokens cannot be shared by " +
                    std::to_string(plan.world_size) + " ranks; expected a multiple of micro_batch x seq_len x ranks = " +
                    std::to_string(B) + " x " + std::to_string(T) + " x " + std::to_string(plan.world_size) + " = " +
                    std::to_string(per_rank));
  const int64_t accumulation = c.training.batch_tokens / per_rank;
  if (accumulation > kMaxAccumulation)
    throw UserError("training.batch_tokens: " + std::to_string(c.training.batch_tokens) + " gives " +
                    std::to_string(accumulation) + " accumulation steps per rank; expected at most " +
                    std::to_string(kMaxAccumulation) + " (raise training.micro_batch)");
  plan.spec = resolve_run(c, plan.world_size);
  // A checkpoint ptrain could not read back is refused here, not found at the first save: every
  // FP8 linear keeps three amax histories in state.json (four linears a block and the LM head,
  // whatever the recipe), and the guard its window of losses.
  const int64_t guard_window = c.training.guard.window;
  for (const PrecisionSchedule::Phase& phase : plan.spec.precision.phases) {
    const Fp8Policy& f8 = phase.policy.fp8;
    if (!f8.enabled) continue;
    const int64_t tensors = int64_t{12} * plan.spec.shape.n_layer + 3;
    if (state_bytes_bound(tensors, f8.amax_history, guard_window) > kMaxStateBytes)
      throw UserError("precision.fp8.amax_history: " + std::to_string(f8.amax_history) + " values for each of " +
                      std::to_string(tensors) + " FP8 tensors would make a checkpoint's state.json larger than the " +
                      format_mib(kMaxStateBytes) + " ptrain reads back; expected at most " +
                      std::to_string(longest_history_within(tensors, guard_window)) + " for this model");
  }
  // The CPU backend holds everything in host memory: a run that cannot fit would die later. A
  // first estimate in double cannot overflow, and bounds the exact one's int64 arithmetic.
  const bool on_cpu = c.run.device == DeviceRequest::cpu ||
                      (c.run.device == DeviceRequest::auto_ && probe_cuda().devices.empty());
  const double have = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  const ModelShape& s = plan.spec.shape;
  const double L = s.n_layer, C = s.n_embd, H = s.n_head, V = s.padded_vocab, F = s.mlp_width();
  const double W = static_cast<double>(s.qkv_width()), mlp_matrices = s.arch == Arch::llama ? 3 : 2;
  const double corpus = c.data.synthetic_enabled ? 6.0 * static_cast<double>(c.data.synthetic.tokens) : 0.0;
  // GPT-2's terms are per_layer = 12 C^2 and 20 C activations per token, as before llama.
  const bool llama = s.arch == Arch::llama;
  const double per_layer = C * W + C * C + mlp_matrices * C * F, heads = llama && !s.tied_head ? 2 : 1;
  const double act_per_token = llama ? 8.0 * C + W + 3 * F : 20.0 * C;
  const double rough =
      4.0 * (6.0 * (heads * V * C + T * C + L * per_layer) + L * B * T * (act_per_token + H * T) + 2.0 * B * T * V) +
      corpus;
  if (rough > 4e18 || (on_cpu && have > 0 && rough > 8 * have))
    throw UserError("model: the run needs about " + format_mib(static_cast<int64_t>(std::min(rough, 9e18))) +
                    " of memory; this machine has " + format_mib(static_cast<int64_t>(have)) +
                    "; expected a smaller model or micro-batch");
  if (on_cpu) {
    const MemoryPlan memory = plan_memory(plan.spec, plan.config.distributed);
    const double need = static_cast<double>(memory.total()) + corpus;
    if (have > 0 && need > have)
      throw UserError("model: the run needs about " + format_mib(static_cast<int64_t>(need)) + " of memory (" +
                      memory.describe() + "); this machine has " + format_mib(static_cast<int64_t>(have)) +
                      "; expected a smaller model or micro-batch");
  }
}

}  // namespace

void DataPlan::open_train(int vocab_size) {
  train.clear();
  train.reserve(sources.size());  // the sampler points into it
  for (const TrainSource& source : sources) {
    const TokenStream& stream = train.emplace_back(source.files, source.key, vocab_size);
    const TokenStream& first = train.front();
    if (&stream.format() != &first.format())
      throw UserError(source.key + ": \"" + source.files.front() + "\" is in " + stream.format().name + " but " +
                      first.key() + "'s \"" + first.files().front() + "\" is in " + first.format().name +
                      "; expected every source made with one vocabulary, in one format");
  }
}

TrainSampler DataPlan::train_sampler(uint64_t seed, int seq_len) const {
  PTRAIN_CHECK(!train.empty() && train.size() == sources.size(),
               "the training shards are not open: a Trainer needs a plan prepare_run has prepared");
  std::vector<const TokenStream*> streams;
  std::vector<double> weights;
  for (size_t k = 0; k < train.size(); ++k) {
    streams.push_back(&train[k]);
    weights.push_back(sources[k].weight);
  }
  return TrainSampler(std::move(streams), weights, seed, seq_len);
}

std::string train_sources_text(const DataPlan& data) {
  int64_t tokens = 0;
  double weights = 0;
  for (const TokenStream& stream : data.train) tokens += stream.size();
  for (const TrainSource& source : data.sources) weights += source.weight;
  std::string text = format_thousands(static_cast<double>(tokens)) + " tokens in " +
                     std::to_string(data.train_files.size()) + " shard(s)";
  if (data.sources.size() < 2) return text;
  text += " from " + std::to_string(data.sources.size()) + " sources by weight:";
  for (size_t k = 0; k < data.sources.size(); ++k)
    text += std::string(k == 0 ? " " : "; ") + in_quotes(data.sources[k].pattern) + " " +
            format_number("%.1f", 100 * data.sources[k].weight / weights) + "% (" +
            format_thousands(static_cast<double>(data.train[k].size())) + " tokens)";
  return text;
}

std::string MemoryPlan::describe() const {
  return format_mib(total()) + " = " + format_mib(params) + " params + " +
         (master ? format_mib(master) + " FP32 master weights + " : std::string()) + format_mib(grads) +
         " FP32 grads + " + format_mib(optimizer) + " AdamW state + " + format_mib(activations) + " activations" +
         (fp8 ? " + " + format_mib(fp8) + " FP8 cast copies" : std::string()) +
         (exchange ? " + " + format_mib(exchange) + " bf16 gradient exchange staging" : std::string());
}

MemoryPlan plan_memory(const RunSpec& spec, const DistributedConfig& distributed) {
  const int zero_stage = distributed.zero_stage;
  const ModelShape& s = spec.shape;
  // The phases store weights alike (bf16 or fp8's bf16): the first's. The CPU stores every
  // format as floats.
  const PrecisionPolicy& policy = spec.precision.phases.front().policy;
  const int B = spec.batch.micro_batch, T = spec.batch.seq_len, world = spec.batch.world_size;
  const int64_t n = param_count(s) * static_cast<int64_t>(sizeof(float));
  // ZeRO-1 to 3: AdamW's moments and the FP32 master weights of this rank's shard only (AdamW);
  // ZeRO-2 and 3 also the gradients' shard, and the grad buckets in place of the whole gradients.
  const bool sharded = zero_stage >= 1 && world > 1;
  const int64_t shard = sharded ? (param_count(s) + world - 1) / world * static_cast<int64_t>(sizeof(float)) : n;
  const GradBucketSizes buckets = grad_bucket_sizes(s);
  const int64_t grads = sharded && zero_stage >= 2 ? buckets.total() * static_cast<int64_t>(sizeof(float)) + shard : n;
  // ZeRO-3: this rank's range of the weights, and the rooms they are gathered into (laid out
  // as the grad buckets; with primary FP8 weights the block linears' codes apart, as floats).
  const bool zero3 = sharded && zero_stage == 3;
  const Zero3Weights z = zero3_weights(s, policy.fp8.enabled && policy.fp8.primary_weights, 0, 0);
  int64_t rooms = z.rooms;
  for (const int64_t c : z.code_rooms) rooms += c;
  const int64_t params = zero3
                             ? shard + rooms * static_cast<int64_t>(sizeof(float))
                             : n - primary_fp8_weight_count(s, policy) * static_cast<int64_t>(sizeof(float));
  // A precision schedule's FP8 cast copies are made at its switches: the plan holds the most any
  // phase has, so that every phase fits where the first did.
  int64_t widest_fp8 = 0;
  for (const auto& phase : spec.precision.phases)
    widest_fp8 = std::max(widest_fp8, gpt_fp8_buffer_bytes(s, phase.policy, B, T, zero3));
  const AdamW::WireStaging wire =
      AdamW::wire_staging(s, zero_stage, world, distributed.grad_reduce_dtype);
  // The CPU keeps the MLP's pre-activation stored as FP8 codes as their values, in floats.
  const bool mlp_codes = keeps_mlp_input_codes(policy, spec.recompute, spec.fp8_throughout);
  const int64_t mlp_store =
      mlp_codes ? int64_t{s.n_layer} * B * T * block_linear_shapes(s)[kFc][1] * int64_t(sizeof(float)) : 0;
  // Primary FP8 weights keep no copy of the block linears' weights beside the master.
  return {params,
          policy.has_master_weights() ? shard : 0,
          grads,
          2 * shard,
          model_activation_bytes(s, B, T, sizeof(float), spec.recompute, spec.fp8_throughout, mlp_codes) +
              rope_table_bytes(s, T) + mlp_store,
          widest_fp8,
          (wire.send + wire.receive) * static_cast<int64_t>(sizeof(float))};
}

RunPlan plan_run(const Config& config, int planned_ranks) {
  RunPlan plan;
  plan.config = config;
  plan.run_dir = (fs::path(config.run.out_dir) / config.run.name).string();
  check_creatable(plan.run_dir, kRunDirWhat, kLongestInnerPath);  // the names, before paths below it are looked at
  plan.faults = StepFaults::from_environment();
  if (config.distributed.grad_reduce_dtype == GradReduceDtype::bf16) (void)AdamW::wire_chunk();  // its variable, now
  plan_machine(plan, planned_ranks);
  // Which checkpoint to resume from decides whether the run directory is continued, so the
  // checkpoint directory is looked at first (read only).
  const bool auto_resume = config.checkpoint.resume_auto();
  locate_checkpoint_dir(plan);
  plan_resume(plan);
  resume_into_fallback(plan);
  // With resume: auto, a run directory ptrain made is continued even without a valid checkpoint
  // (a job preempted before its first save starts again in place): always launching with auto works.
  const bool continuing = plan.resume.has_value() || auto_resume;
  plan.run_dir_action = plan_run_dir(config, plan.run_dir, continuing);
  settle_checkpoint_dir(plan, continuing);
  if (plan.resume && plan.run_dir_action != RunDirAction::replace &&
      path_kind(plan.checkpoint_dir, "checkpoint.dir") == PathKind::directory)
    plan.superseded = checkpoints_after(plan.checkpoint_dir, plan.resume->state.step);
  if (plan.run_dir_action == RunDirAction::replace || plan.clear_checkpoint_dir) plan.superseded.clear();
  if (plan.resume && plan.run_dir_action == RunDirAction::replace && !plan.checkpoint_dir_is_explicit)
    throw UserError("checkpoint.resume: the checkpoint is inside " + plan.run_dir +
                    ", which run.overwrite would delete; expected run.overwrite: false to resume");
  plan_init_from(plan);
  plan.data = plan_data(config, plan.run_dir, plan.warnings);
  // The embeddings a checkpoint learned mean its tokenizer's ids (checkpoints from before
  // tokenizers were recorded, and data whose tokenizer is unknown, pass).
  const std::string& trained_on = plan.resume ? plan.resume->state.tokenizer : std::string();
  if (!trained_on.empty() && !plan.data.tokenizer.empty() && trained_on != plan.data.tokenizer)
    throw UserError("checkpoint.resume: " + plan.resume->path + " was trained on " + trained_on +
                    " tokens, but the training shards are " + plan.data.tokenizer +
                    " tokens; expected shards made by the checkpoint's tokenizer (" + trained_on + ")");
  // And on one vocabulary: the same tokenizer with other files gives other ids.
  const std::string& vocabulary = plan.resume ? plan.resume->state.vocabulary_sha256 : std::string();
  if (!vocabulary.empty() && !plan.data.vocabulary_sha256.empty() && vocabulary != plan.data.vocabulary_sha256)
    throw UserError("checkpoint.resume: " + plan.resume->path + " was trained on the " + trained_on +
                    " vocabulary with SHA-256 " + vocabulary + ", but the training shards' " + kTokenizerRecord +
                    " records SHA-256 " + plan.data.vocabulary_sha256 +
                    "; expected shards made with the checkpoint's vocabulary (data prepare --vocab)");
  // Shards without a record, resumed: the checkpoints after it keep what the checkpoint knew.
  if (plan.data.tokenizer.empty()) plan.data.tokenizer = trained_on;
  if (plan.data.vocabulary_sha256.empty()) plan.data.vocabulary_sha256 = vocabulary;
  return plan;
}

std::string describe_plan(const RunPlan& plan) {
  const Config& c = plan.config;
  const PrecisionSchedule& phases = plan.spec.precision;
  const PrecisionPolicy& policy = phases.phases.front().policy;
  const ModelShape& shape = plan.spec.shape;
  const int B = plan.spec.batch.micro_batch, T = plan.spec.batch.seq_len;
  std::string out;
  const auto line = [&](const std::string& text) { out += text + "\n"; };
  const std::string flops = format_number("%.3g", plan.spec.flops_per_token);
  if (shape.arch == Arch::llama)
    line("model: llama, " + std::to_string(shape.n_head) + " query heads over " + std::to_string(shape.kv_heads()) +
         " K/V heads, SwiGLU width " + std::to_string(shape.mlp_width()) + ", RoPE theta " +
         format_thousands(shape.rope_theta) + ", " + (shape.tied_head ? "tied" : "untied") + " LM head" +
         (shape.qk_norm ? ", QK-norm" : ""));
  line("parameters: " + format_thousands(static_cast<double>(param_count(shape))) + " (vocabulary padded to " +
       std::to_string(shape.padded_vocab) + ")");
  line(std::string("training FLOPs per token: ") + flops);
  line("precision: " + (phases.scheduled() ? phases.describe() : policy.label()) + " (weights " +
       format_name(policy.weights) +
       (policy.fp8.enabled && policy.fp8.primary_weights
            ? " (the block linears': FP8 codes only, cast from the FP32 master)"
            : "") +
       ", activations " + format_name(policy.activations) + ", their gradients " +
       format_name(policy.activation_grads) + ", weight gradients fp32, loss scaling " +
       choice_name(policy.loss_scaling.mode) + ")");
  line("memory estimate: " + plan_memory(plan.spec, plan.config.distributed).describe() + " (micro-batch " +
       std::to_string(B) + " x " + std::to_string(T) + ")");
  if (plan.data.synthetic)
    line("data: a synthetic corpus of " + format_thousands(static_cast<double>(plan.data.synthetic->tokens)) +
         " tokens, generated into " + (fs::path(plan.run_dir) / "data").string());
  else
    line("data: train " + train_sources_text(plan.data) + ", val " +
         format_thousands(static_cast<double>(plan.data.val->size())) + " tokens in " +
         std::to_string(plan.data.val_files.size()) + " shard(s), tokenizer " +
         (plan.data.tokenizer.empty() ? "unknown" : plan.data.tokenizer) +
         " (headers and sizes checked; token ids are checked as they are read)");
  const char* action = plan.run_dir_action == RunDirAction::create    ? "would be created"
                       : plan.run_dir_action == RunDirAction::replace ? "exists and would be replaced (run.overwrite)"
                                                                      : "exists and would be continued";
  line("run directory: " + plan.run_dir + " " + action);
  line("checkpoints: " + plan.checkpoint_dir +
       (plan.clear_checkpoint_dir ? " (the replaced run's checkpoints there would be removed)" : ""));
  if (plan.resume)
    line("resume: from " + plan.resume->path + " after step " + std::to_string(plan.resume->state.step) +
         " (verified)");
  else if (c.checkpoint.resume_auto())
    line("resume: auto, no valid checkpoint found: training would start from step 0");
  for (const auto& s : plan.superseded)
    line("would set aside " + s + " at the run's first checkpoint (" +
         (plan.resume ? "after the checkpoint resumed from" : "not usable") + ")");
  if (plan.init_from) line("init_from: " + c.model.init_from + " (" + plan.init_from->source + ", verified)");
  if (plan.world_size > 1) line("ranks: " + std::to_string(plan.world_size));
  return out;
}

}  // namespace ptrain
