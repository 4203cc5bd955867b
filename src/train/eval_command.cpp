#include "train/eval_command.h"

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "core/input_file.h"
#include "core/output_file.h"
#include "data/dataset.h"
#include "data/synthetic.h"
#include "data/tokenizer_record.h"
#include "train/output_policy.h"

namespace fs = std::filesystem;

namespace ptrain {

namespace {

// What --force may replace: a file that begins as the dump below does.
bool is_logits_dump(const fs::path& path) {
  try {
    const InputFile in(path.string(), "--dump-logits");
    const std::string head = "{\"checkpoint\":";
    if (in.size() < static_cast<int64_t>(head.size())) return false;
    std::string got(head.size(), '\0');
    in.read_at(0, got.data(), got.size());
    return got == head;
  } catch (const UserError&) {
    return false;
  }
}

void dump_window_logits(const std::string& path, const LoadedCheckpoint& ckpt, const ModelConfig& m,
                        const std::vector<int32_t>& window) {
  const int T = static_cast<int>(window.size());
  LoadedModel lm = load_model(ckpt, m, 1, T);
  const std::vector<float> logits = lm.model->window_logits(window.data());
  nlohmann::ordered_json j;
  j["checkpoint"] = ckpt.path;
  j["step"] = ckpt.state.step;
  j["vocab_size"] = m.vocab_size;
  j["tokens"] = window;
  j["logits"] = nlohmann::ordered_json::array();
  for (int t = 0; t < T; ++t)
    j["logits"].push_back(std::vector<float>(logits.begin() + int64_t{t} * m.vocab_size,
                                             logits.begin() + int64_t{t + 1} * m.vocab_size));
  write_file_atomic(path, j.dump() + "\n");
  std::printf("wrote the logits of %d positions x %d tokens\n", T, m.vocab_size);
}

double val_loss(Transformer& model, const ValSampler& sampler, int B, int T) {
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double sum = 0;
  for (int j = 0; j < sampler.batches(); ++j) {
    sampler.fill(j, inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), 0.0f);
  }
  return sum / sampler.batches();
}

// The validation windows eval reads: the corpus a training run generated into its directory,
// or the config's shards.
struct ValData {
  TokenStream stream;
  ValSampler sampler;
  explicit ValData(const Config& config)
      : stream(config.data.synthetic_enabled
                   ? std::vector<std::string>{synthetic_val_file(
                         (fs::path(config.run.out_dir) / config.run.name / "data").string())}
                   : expand_shard_glob(config.data.val, "data.val"),
               "data.val", config.model.vocab_size),
        sampler(stream, "data.val", config.training.eval_batches, config.training.micro_batch,
                config.training.effective_seq_len(config.model)) {}
};

// The embeddings learned the ids of the checkpoint's tokenizer and vocabulary: val shards whose
// record names another are refused (shards without a record, or a checkpoint that knows none,
// pass), as a resume refuses them.
void check_val_tokenizer(const LoadedCheckpoint& ckpt, const TokenStream& val) {
  const std::string dir = fs::path(val.files().front()).parent_path().string();
  const std::optional<TokenizerRecord> record = read_tokenizer_record(dir.empty() ? "." : dir);
  if (!record) return;
  const std::string where = "data.val: \"" + (fs::path(dir) / kTokenizerRecord).string() + "\"";
  const CheckpointState& s = ckpt.state;
  if (!s.tokenizer.empty() && record->tokenizer != s.tokenizer)
    throw UserError(where + " says the shards were made by " + record->tokenizer + ", but --checkpoint " + ckpt.path +
                    " was trained on " + s.tokenizer + " tokens; expected val shards made by the checkpoint's tokenizer");
  if (!s.vocabulary_sha256.empty() && !record->vocabulary_sha256.empty() &&
      record->vocabulary_sha256 != s.vocabulary_sha256)
    throw UserError(where + " records vocabulary SHA-256 " + record->vocabulary_sha256 + ", but --checkpoint " +
                    ckpt.path + " was trained on the vocabulary of SHA-256 " + s.vocabulary_sha256 +
                    "; expected val shards made with the checkpoint's vocabulary");
}

LoadedCheckpoint load_checkpoint_of_shape(const std::string& checkpoint, const ModelConfig& model) {
  LoadedCheckpoint ckpt = load_checkpoint(checkpoint);
  const auto differences = model_differences(ckpt.state.model, model_json(model));
  if (!differences.empty()) {
    std::vector<std::string> problems;
    for (const auto& d : differences) problems.push_back("--checkpoint " + checkpoint + " has another model shape: " + d);
    throw UserErrors(problems);
  }
  return ckpt;
}

}  // namespace

CheckpointLosses checkpoint_val_losses(const Config& config, const std::string& checkpoint, WeightFormat weights) {
  const LoadedCheckpoint ckpt = load_checkpoint_of_shape(checkpoint, config.model);
  const ValData val(config);
  check_val_tokenizer(ckpt, val.stream);
  const int B = config.training.micro_batch, T = config.training.effective_seq_len(config.model);
  CheckpointLosses out;
  out.step = ckpt.state.step;
  out.batches = val.sampler.batches();
  out.fp32 = val_loss(*load_model(ckpt, config.model, B, T).model, val.sampler, B, T);
  if (weights == WeightFormat::int8)
    out.int8 = val_loss(*load_model(ckpt, config.model, B, T, WeightFormat::int8).model, val.sampler, B, T);
  const auto info = read_synthetic_info(fs::path(val.stream.files().front()).parent_path().string());
  if (info) out.oracle = info->oracle_loss_val;
  return out;
}

void eval_checkpoint(const Config& config, const std::string& checkpoint, const std::string& dump_logits,
                     WeightFormat weights, bool force) {
  if (force && dump_logits.empty()) throw UserError("--force replaces an earlier --dump-logits file; expected --dump-logits");
  const std::string dump_path =
      dump_logits.empty()
          ? ""
          : plan_output(dump_logits, OutputRule{"--dump-logits", false, "ptrain eval --dump-logits", force, is_logits_dump});
  const CheckpointLosses l = checkpoint_val_losses(config, checkpoint, weights);
  const int B = config.training.micro_batch, T = config.training.effective_seq_len(config.model);
  std::printf("checkpoint %s (step %lld): val_loss %.6f over %d batches of %d x %d\n", checkpoint.c_str(),
              static_cast<long long>(l.step), l.fp32, l.batches, B, T);
  if (l.oracle) std::printf("oracle loss %.6f, gap %.6f\n", *l.oracle, l.fp32 - *l.oracle);
  if (l.int8)
    std::printf("int8 weights: val_loss %.6f, %+.6f (%+.3f%%) against the fp32 masters; %s\n", *l.int8,
                *l.int8 - l.fp32, 100.0 * (*l.int8 - l.fp32) / l.fp32, int8_note(config.model).c_str());
  if (!dump_logits.empty()) {
    const ValData val(config);
    std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
    val.sampler.fill(0, inputs.data(), targets.data());
    dump_window_logits(dump_path, load_checkpoint_of_shape(checkpoint, config.model), config.model,
                       std::vector<int32_t>(inputs.begin(), inputs.begin() + T));
  }
}

}  // namespace ptrain
