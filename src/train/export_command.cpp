#include "train/export_command.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

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

void export_hf(const HfExportOptions& o) {
  StDtype dtype = StDtype::f32;
  if (o.dtype == "bf16") dtype = StDtype::bf16;
  else if (o.dtype == "fp16") dtype = StDtype::f16;
  else if (o.dtype != "fp32") throw UserError("--dtype: \"" + o.dtype + "\"; expected fp32, bf16 or fp16");
  HfDirectoryContents contents;
  contents.dtype = dtype;
  contents.max_shard_bytes = parse_shard_size(o.max_shard_size, "--max-shard-size");
  const std::string target = plan_output(o.out, OutputRule{"--out", true, "ptrain export --format hf", o.force,
                                [](const fs::path& p) { return is_hf_export(p); }});
  const LoadedCheckpoint ckpt = load_checkpoint(o.checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  try {
    contents.specs = hf_tensor_specs(m);
  } catch (const UserError& e) {
    throw UserError("--checkpoint " + o.checkpoint + ": " + e.what());
  }
  int end_of_text = -1;
  const std::string& name = ckpt.state.tokenizer;
  if (!name.empty()) {
    const HfTokenizerFiles tokenizer = hf_tokenizer_files(checkpoint_tokenizer(ckpt, name, o.vocabulary), m.seq_len);
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

namespace {

// Whether `dir` is what data hf-tokenizer writes: only its files, each a regular file, with its
// tokenizer_config.json (a Hugging Face download has more keys, or other files, and is refused).
bool is_hf_tokenizer_output(const fs::path& dir) {
  const std::vector<std::string> names = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                          "vocab.json", "merges.txt"};
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (!entry.is_regular_file(ec) || entry.is_symlink(ec) ||
        std::find(names.begin(), names.end(), entry.path().filename()) == names.end())
      return false;
  for (const char* needed : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    if (ec || !fs::is_regular_file(dir / needed, ec)) return false;
  // ptrain writes a few hundred bytes; a larger file (a chat template) is someone else's.
  constexpr uintmax_t kOurConfigBytes = 1 << 16;
  const fs::path config_path = dir / "tokenizer_config.json";
  const uintmax_t config_bytes = fs::file_size(config_path, ec);
  if (ec || config_bytes > kOurConfigBytes) return false;
  const nlohmann::json config = nlohmann::json::parse(
      InputFile(config_path.string(), "tokenizer_config.json").read_all(kOurConfigBytes), nullptr, false);
  if (!config.is_object()) return false;
  const std::vector<std::string> keys = {"tokenizer_class", "model_max_length", "bos_token", "eos_token", "unk_token",
                                         "add_prefix_space"};
  for (const auto& [key, value] : config.items())
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) return false;
  const std::string kind = config.value("tokenizer_class", "");
  return kind == "PreTrainedTokenizerFast" || kind == "GPT2Tokenizer";
}

}  // namespace

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
