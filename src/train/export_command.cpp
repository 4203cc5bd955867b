#include "train/export_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <regex>
#include <set>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_directory.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/llmc.h"
#include "core/input_file.h"
#include "core/error.h"
#include "core/paths.h"
#include "data/hf_tokenizer_files.h"
#include "data/tokenizer.h"
#include "train/checkpoint_model.h"
#include "train/output_policy.h"

namespace fs = std::filesystem;

namespace ptrain {

void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype, bool force) {
  if (dtype != "fp32" && dtype != "bf16") throw UserError("--dtype: \"" + dtype + "\"; expected fp32 or bf16");
  // The output is checked before the checkpoint is read: a bad --out writes nothing.
  OutputRule rule{"--out", false, "ptrain export --format llmc", force,
                  [](const fs::path& p) { return is_llmc_model_file(p.string()); }};
  rule.inner_bytes = 8;  // the temporary name beside it
  const std::string target = plan_output(out, rule);
  const LoadedCheckpoint ckpt = load_checkpoint(checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  if (m.arch != Arch::gpt2)
    throw UserError("--checkpoint " + checkpoint + ": a " + choice_name(m.arch) + " model; llm.c's model file holds GPT-2 only " +
                    "(learned positions, LayerNorm with biases, GELU, tied head), so it cannot be written as one");
  LlmcModel file;
  file.version = dtype == "fp32" ? 3 : 5;
  file.max_seq_len = m.seq_len;
  file.vocab_size = m.vocab_size;
  file.n_layer = m.n_layer;
  file.n_head = m.n_head;
  file.n_embd = m.n_embd;
  file.padded_vocab = m.padded_vocab();
  file.params = flat_weights(ckpt, m);
  write_llmc(target, file);
  std::printf("wrote %s: llm.c model file version %d (%s), %zu parameters\n", out.c_str(), file.version, dtype.c_str(),
              file.params.size());
}

namespace {

// What `--force` may replace is only what these commands write: a directory that holds anything
// else (a user's notes, a model card added to an export, a Hugging Face download with its
// generation_config.json or transformers_version) is refused, never removed.
const std::vector<std::string> kTokenizerFiles = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                                  "vocab.json", "merges.txt"};

bool is_tokenizer_file(const std::string& name) {
  return std::find(kTokenizerFiles.begin(), kTokenizerFiles.end(), name) != kTokenizerFiles.end();
}

// Whether every entry of `dir` is a regular file (no link, no directory) that `ours` names.
template <typename Names>
bool holds_only(const fs::path& dir, Names ours) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (!entry.is_regular_file(ec) || entry.is_symlink(ec) || !ours(entry.path().filename().string())) return false;
  return !ec;
}

// A small JSON object file (ptrain writes a few hundred bytes) whose keys are all among `keys`.
std::optional<nlohmann::json> object_within(const fs::path& path, const std::set<std::string>& keys) {
  constexpr uintmax_t kOurBytes = 1 << 16;
  std::error_code ec;
  const uintmax_t bytes = fs::file_size(path, ec);
  if (ec || bytes > kOurBytes) return std::nullopt;
  nlohmann::json j =
      nlohmann::json::parse(InputFile(path.string(), path.filename().string()).read_all(kOurBytes), nullptr, false);
  if (!j.is_object()) return std::nullopt;
  for (const auto& [key, value] : j.items())
    if (!keys.count(key)) return std::nullopt;
  return j;
}

// ptrain's tokenizer_config.json (a Hugging Face download's has more keys: a chat template, ...).
bool is_our_tokenizer_config(const fs::path& path) {
  const std::optional<nlohmann::json> config = object_within(
      path, {"tokenizer_class", "model_max_length", "bos_token", "eos_token", "unk_token", "add_prefix_space"});
  const nlohmann::json kind = config ? config->value("tokenizer_class", nlohmann::json()) : nlohmann::json();
  return kind == "PreTrainedTokenizerFast" || kind == "GPT2Tokenizer";
}

// The keys of the config.json files export --format hf writes, for either architecture.
std::set<std::string> hf_config_keys() {
  std::set<std::string> keys;
  for (const Arch arch : {Arch::gpt2, Arch::llama}) {
    ModelConfig m;
    m.arch = arch;
    m.n_layer = m.n_head = 1;
    m.n_embd = m.seq_len = m.vocab_size = 64;
    const nlohmann::ordered_json config = hf_config_json(m, 0, "float32");
    for (const auto& [key, value] : config.items()) keys.insert(key);
  }
  return keys;
}

// What export --format hf writes: config.json, the weights (one file, or shards and their
// index) and the tokenizer's files.
bool is_hf_export(const fs::path& dir) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  const auto ours = [](const std::string& name) {
    return name == "config.json" || name == "model.safetensors" || name == "model.safetensors.index.json" ||
           std::regex_match(name, shard) || is_tokenizer_file(name);
  };
  std::error_code ec;
  return holds_only(dir, ours) && fs::is_regular_file(dir / "config.json", ec) &&
         object_within(dir / "config.json", hf_config_keys()) &&
         (!fs::exists(dir / "tokenizer_config.json", ec) || is_our_tokenizer_config(dir / "tokenizer_config.json"));
}

// What data hf-tokenizer writes: only the tokenizer's files, with ptrain's tokenizer_config.json.
bool is_hf_tokenizer_output(const fs::path& dir) {
  std::error_code ec;
  if (!holds_only(dir, is_tokenizer_file)) return false;
  for (const char* needed : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (!fs::is_regular_file(dir / needed, ec)) return false;
  return is_our_tokenizer_config(dir / "tokenizer_config.json");
}

}  // namespace

void export_hf(const HfExportOptions& o) {
  StDtype dtype = StDtype::f32;
  if (o.dtype == "bf16") dtype = StDtype::bf16;
  else if (o.dtype == "fp16") dtype = StDtype::f16;
  else if (o.dtype != "fp32") throw UserError("--dtype: \"" + o.dtype + "\"; expected fp32, bf16 or fp16");
  HfDirectoryContents contents;
  contents.dtype = dtype;
  contents.max_shard_bytes = parse_shard_size(o.max_shard_size, "--max-shard-size");
  const std::string target =
      plan_output(o.out, OutputRule{"--out", true, "ptrain export --format hf", o.force, is_hf_export});
  const LoadedCheckpoint ckpt = load_checkpoint(o.checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  try {
    contents.specs = hf_tensor_specs(m);
  } catch (const UserError& e) {
    throw UserError("--checkpoint " + o.checkpoint + ": " + e.what());
  }
  int end_of_text = -1;
  const std::string& name = ckpt.state.tokenizer;
  if (const std::optional<Tokenizer> text = checkpoint_tokenizer(ckpt, name, o.vocabulary)) {
    const HfTokenizerFiles tokenizer = hf_tokenizer_files(*text, m.seq_len);
    contents.text_files.insert(tokenizer.files.begin(), tokenizer.files.end());
    end_of_text = tokenizer.end_of_text;
  }
  const char* torch_dtype = dtype == StDtype::f32 ? "float32" : dtype == StDtype::bf16 ? "bfloat16" : "float16";
  contents.text_files["config.json"] = hf_config_json(m, end_of_text, torch_dtype).dump(2) + "\n";
  const std::vector<float> flat = flat_weights(ckpt, m);
  contents.flat = flat.data();
  const std::vector<std::string> files = write_hf_directory(target, contents);
  std::printf("wrote %s: Hugging Face %s model (%s), %zu tensors in %zu safetensors file%s%s\n", o.out.c_str(),
              m.arch == Arch::llama ? "LlamaForCausalLM" : "GPT2LMHeadModel", o.dtype.c_str(), contents.specs.size(),
              files.size(), files.size() == 1 ? "" : "s",
              name.empty() ? "" : (", " + name + " tokenizer files").c_str());
}


void export_hf_tokenizer(const HfTokenizerExportOptions& o) {
  const std::string target =
      plan_output(o.out, OutputRule{"--out", true, "ptrain data hf-tokenizer", o.force, is_hf_tokenizer_output});
  HfDirectoryContents contents;
  const Tokenizer tokenizer = Tokenizer::load(o.tokenizer, o.vocabulary);
  contents.text_files = hf_tokenizer_files(tokenizer, o.model_max_length).files;
  write_hf_directory(target, contents);
  std::printf("wrote %s: the %s tokenizer's Hugging Face files (", o.out.c_str(), o.tokenizer.c_str());
  for (auto it = contents.text_files.begin(); it != contents.text_files.end(); ++it)
    std::printf("%s%s", it == contents.text_files.begin() ? "" : ", ", it->first.c_str());
  std::printf("), %d ids\n", tokenizer.vocab_size());
}

}  // namespace ptrain
