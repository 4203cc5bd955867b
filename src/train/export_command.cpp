#include "train/export_command.h"

#include <cstdio>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_directory.h"
#include "checkpoint/hf_layout.h"
#include "checkpoint/llmc.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/paths.h"
#include "core/sha256.h"
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
  if (name == "gpt2") {
    const Tokenizer tokenizer = checkpoint_tokenizer(ckpt, "gpt2", o.vocabulary);
    end_of_text = static_cast<int>(tokenizer.end_of_text());
    const std::string& vocab = contents.text_files["vocab.json"] = bpe_vocab_json(*tokenizer.bpe());
    const std::string& merges = contents.text_files["merges.txt"] = bpe_merges_txt(*tokenizer.bpe());
    contents.text_files["tokenizer_config.json"] = gpt2_tokenizer_config(m.seq_len);
    contents.text_files["tokenizer.json"] = gpt2_tokenizer_json(vocab, merges, tokenizer.end_of_text());
    contents.text_files["special_tokens_map.json"] = gpt2_special_tokens_map();
  } else if (name == "bytes") {
    contents.text_files["tokenizer.json"] = bytes_tokenizer_json();
    contents.text_files["tokenizer_config.json"] = fast_tokenizer_config(m.seq_len, "");
    contents.text_files["special_tokens_map.json"] = special_tokens_map("");
  } else if (!name.empty()) {
    const Tokenizer tokenizer = checkpoint_tokenizer(ckpt, name, o.vocabulary);
    const BpeVocabulary& v = *tokenizer.bpe();
    std::string document_token;
    if (tokenizer.has_end_of_text()) {
      end_of_text = static_cast<int>(tokenizer.end_of_text());
      document_token = std::string(v.bytes(tokenizer.end_of_text()));
    }
    // A tokenizer read from a tokenizer.json is exported as that file; a tiktoken encoding's is
    // written from its ranks.
    if (is_tokenizer_json_name(name)) {
      std::string& file = contents.text_files["tokenizer.json"] =
          InputFile(v.source(), "tokenizer.json \"" + v.source() + "\"").read_all(int64_t{256} << 20);
      if (sha256_hex(file.data(), file.size()) != v.sha256())
        throw UserError("tokenizer.json \"" + v.source() + "\" changed while the export read it; expected it unchanged");
    } else {
      contents.text_files["tokenizer.json"] =
          tiktoken_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), v, tokenizer.pretokenizer()->pattern());
    }
    contents.text_files["tokenizer_config.json"] = fast_tokenizer_config(m.seq_len, document_token);
    contents.text_files["special_tokens_map.json"] = special_tokens_map(document_token);
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

}  // namespace ptrain
