#include "train/tools.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <optional>
#include <sstream>

#include "backend/backend.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_directory.h"
#include "checkpoint/llmc.h"
#include "core/sha256.h"
#include "core/error.h"
#include "core/format.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"
#include "core/rng.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "data/gpt2_hf_files.h"
#include "data/synthetic.h"
#include "data/tokenizer.h"
#include "metrics/run_log.h"
#include "model/gpt.h"
#include "precision/int8_weights.h"
#include "train/sampling.h"

namespace fs = std::filesystem;

namespace ptrain {
namespace {

// A model holding a checkpoint's weights, in FP32.
struct LoadedModel {
  std::unique_ptr<Backend> backend = make_cpu_backend(0);
  std::unique_ptr<Gpt> model;
};

// The weights --weights int8 quantizes: the four linears of every block (attention qkv and
// output, the MLP's two).
bool is_block_linear(ParamId id) { return id == kQkvw || id == kAttprojw || id == kFcw || id == kFcprojw; }

// Replaces the block linears' weights by their INT8 round trip; returns how many weights that was.
int64_t quantize_block_linears(Gpt& model) {
  int64_t quantized = 0;
  for (const ParamSpec& spec : model.specs()) {
    if (!is_block_linear(spec.id)) continue;
    const int64_t cols = spec.shape.back(), rows = model.param(spec.id).numel() / cols;  // (L, out, in)
    std::vector<float> w(static_cast<size_t>(rows * cols));
    model.backend().download(w.data(), model.master(spec.id));
    dequantize_int8_rows(quantize_int8_rows(w.data(), rows, cols), w.data());
    model.backend().upload(model.master(spec.id), w.data());
    quantized += rows * cols;
  }
  model.sync_params_from_master();
  return quantized;
}

LoadedModel load_model(const LoadedCheckpoint& ckpt, const ModelConfig& m, int B, int T,
                       WeightFormat weights = WeightFormat::fp32) {
  LoadedModel out;
  out.model = std::make_unique<Gpt>(GptShape::of(m), *out.backend, DType::f32, B, T);
  load_weights(ckpt.weights, *out.model);
  if (weights == WeightFormat::int8) quantize_block_linears(*out.model);
  return out;
}

// "786,432 of 842,496 parameters (the block linears) in INT8, per output channel".
std::string int8_note(const ModelConfig& m) {
  int64_t linear = 0, all = 0;
  for (const ParamSpec& spec : gpt_param_specs(GptShape::of(m))) {
    const int64_t n = shape_numel(spec.shape);
    all += n;
    if (is_block_linear(spec.id)) linear += n;
  }
  return format_thousands(static_cast<double>(linear)) + " of " + format_thousands(static_cast<double>(all)) +
         " parameters (the block linears) in INT8, per output channel";
}

// The prompt as token ids: text through the tokenizer, or written-out ids when there is none.
std::vector<int32_t> encode_prompt(const std::string& prompt, const Tokenizer* tokenizer, int vocab) {
  std::vector<int32_t> ids;
  if (tokenizer) {
    for (const uint16_t id : tokenizer->encode(prompt, "--prompt")) ids.push_back(id);
    return ids;
  }
  std::istringstream in(prompt);
  std::string word;
  while (in >> word) {
    char* end = nullptr;
    const long id = std::strtol(word.c_str(), &end, 10);
    if (*end != '\0' || id < 0 || id >= vocab)
      throw UserError("--prompt: \"" + word + "\" is not a token id below " + std::to_string(vocab) +
                      "; expected space-separated token ids (the checkpoint records no tokenizer)");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Refuses an output file path that names a directory or cannot be created, before any work.
void check_output_file(const std::string& path, const std::string& what) {
  const PathKind kind = path_kind(path, what);
  if (kind == PathKind::directory || kind == PathKind::other)
    throw UserError(what + ": \"" + path + "\" exists and is not a regular file; expected the path of the file to write");
  check_creatable(fs::absolute(path).lexically_normal().parent_path().string(), what,
                  fs::path(path).filename().string().size() + 8);
}

// A checkpoint's weights as ptrain's flat parameter vector (the order of gpt_param_specs).
std::vector<float> flat_weights(const LoadedCheckpoint& ckpt, const ModelConfig& m) {
  std::vector<float> flat;
  for (const ParamSpec& spec : gpt_param_specs(GptShape::of(m))) {
    const int64_t n = shape_numel(spec.shape);
    const size_t at = flat.size();
    flat.resize(at + static_cast<size_t>(n));
    ckpt.weights.copy_to(spec.name, flat.data() + at, n);
  }
  return flat;
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
  std::printf("wrote %s: logits of %d positions x %d tokens\n", path.c_str(), T, m.vocab_size);
}

double val_loss(Gpt& model, const ValSampler& sampler, int B, int T) {
  std::vector<int32_t> inputs(static_cast<size_t>(B) * T), targets(inputs.size());
  double sum = 0;
  for (int j = 0; j < sampler.batches(); ++j) {
    sampler.fill(j, inputs.data(), targets.data());
    sum += model.forward(inputs.data(), targets.data(), 0.0f);
  }
  return sum / sampler.batches();
}

}  // namespace

WeightFormat parse_weight_format(const std::string& text) {
  if (text == "fp32") return WeightFormat::fp32;
  if (text == "int8") return WeightFormat::int8;
  throw UserError("--weights: \"" + text + "\"; expected fp32 (the checkpoint's masters) or int8");
}

namespace {

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
                     WeightFormat weights) {
  if (!dump_logits.empty()) check_output_file(dump_logits, "--dump-logits");
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
    dump_window_logits(dump_logits, load_checkpoint_of_shape(checkpoint, config.model), config.model,
                       std::vector<int32_t>(inputs.begin(), inputs.begin() + T));
  }
}

void sample(const SampleOptions& o) {
  if (o.tokens < 1) throw UserError("--tokens: " + std::to_string(o.tokens) + "; expected at least 1");
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw UserError("--temperature: " + std::to_string(o.temperature) + "; expected a finite number, 0 (greedy) or more");
  if (o.top_k < 0) throw UserError("--top-k: expected 0 (no limit) or more");
  const LoadedCheckpoint ckpt = load_checkpoint(o.checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  // Checkpoints from before tokenizers were recorded: a 256-token vocabulary was bytes.
  std::string name = ckpt.state.tokenizer;
  if (name.empty() && m.vocab_size == 256) name = "bytes";
  std::optional<Tokenizer> tokenizer;
  if (!name.empty()) tokenizer = Tokenizer::load(name, name == "gpt2" ? o.vocabulary : "");
  if (tokenizer && tokenizer->vocab_size() > m.vocab_size)
    throw UserError("--checkpoint " + o.checkpoint + ": the model's vocabulary (" + std::to_string(m.vocab_size) +
                    ") is smaller than its tokenizer's (" + name + ", " + std::to_string(tokenizer->vocab_size()) + ")");
  const Tokenizer* text = tokenizer ? &*tokenizer : nullptr;
  LoadedModel lm = load_model(ckpt, m, 1, m.seq_len, o.weights);
  if (o.weights == WeightFormat::int8) std::fprintf(stderr, "sample: %s\n", int8_note(m).c_str());
  std::vector<int32_t> tokens = encode_prompt(o.prompt, text, m.vocab_size);
  if (tokens.empty()) tokens = empty_prompt(text);
  if (text) std::fwrite(o.prompt.data(), 1, o.prompt.size(), stdout);
  Rng rng(o.seed, 0x5A4D504C45ull);
  GenerateOptions g{o.tokens, o.temperature, o.top_k, -1, text ? text->vocab_size() : 0, o.kv_cache};
  if (text && text->has_end_of_text() && !o.ignore_end_of_text) g.stop_token = text->end_of_text();
  bool first = true;
  int generated = 0;
  const auto start = std::chrono::steady_clock::now();
  generate(*lm.model, tokens, g, rng, [&](int32_t next) {
    ++generated;
    if (text) {
      // Bytes as they come: a character split across tokens is whole once its last byte is out.
      const std::string piece = text->decode({next});
      std::fwrite(piece.data(), 1, piece.size(), stdout);
    } else {
      std::printf("%s%d", first ? "" : " ", next);
    }
    first = false;
    std::fflush(stdout);
  });
  std::printf("\n");
  if (o.timing) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "sample: %d tokens in %.3f s, %.1f tokens/s (%s, context %d)\n", generated, seconds,
                 generated / seconds, o.kv_cache ? "KV cache" : "whole window per token", m.seq_len);
  }
}

namespace {

void print_tensors(const SafetensorsFile& st, const char* indent) {
  for (const auto& name : st.names()) {
    std::string shape;
    for (int64_t d : st.shape(name)) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    std::printf("%s%-16s F32 (%s)\n", indent, name.c_str(), shape.c_str());
  }
}

// A checkpoint directory: what state.json says and each file's checksum, then the complete
// verification resume makes; an invalid checkpoint is an error (exit 2) saying why.
void inspect_checkpoint(const fs::path& p) {
  const std::string path = p.string();
  if (path_kind((p / "state.json").string(), "inspect") == PathKind::missing)
    throw UserError("\"" + path + "\" is a directory without state.json: not a checkpoint, or an incomplete save "
                    "(NOT valid: resume would skip it)");
  const std::string state_path = (p / "state.json").string();
  const nlohmann::json state = parse_json(InputFile(state_path, "\"" + state_path + "\"").read_all(64 << 20), "\"" + state_path + "\"");
  if (!state.is_object() || !state.value("sha256", nlohmann::json::object()).is_object())
    throw UserError("\"" + path + "/state.json\" is not a ptrain checkpoint state");
  std::printf("checkpoint %s\n  step %s, tokens %s, precision %s\n  model %s\n", path.c_str(),
              state.value("step", nlohmann::json()).dump().c_str(), state.value("tokens", nlohmann::json()).dump().c_str(),
              state.value("precision", nlohmann::json()).dump().c_str(), state.value("model", nlohmann::json()).dump().c_str());
  // Checkpoints from before model.arch are GPT-2's.
  const nlohmann::json model = state.value("model", nlohmann::json::object());
  const nlohmann::json arch = model.is_object() ? model.value("arch", nlohmann::json("gpt2")) : nlohmann::json();
  std::printf("  architecture %s\n", arch.is_string() ? arch.get<std::string>().c_str() : arch.dump().c_str());
  if (state.contains("loss_scaler")) std::printf("  loss scaler %s\n", state["loss_scaler"].dump().c_str());
  if (state.contains("fp8")) std::printf("  fp8 tensors with scaling state: %zu\n", state["fp8"].size());
  for (const auto& [file, expected] : state["sha256"].items()) {
    const fs::path f = p / file;
    const bool plain_name = file.find('/') == std::string::npos && file != ".." && file != ".";
    if (!plain_name || path_kind(f.string(), "inspect") == PathKind::missing) {
      std::printf("  %-22s MISSING\n", file.c_str());
      continue;
    }
    try {
      std::string bytes = InputFile(f.string(), "\"" + f.string() + "\"").read_all(std::numeric_limits<int64_t>::max());
      const bool valid = expected.is_string() && sha256_hex(bytes.data(), bytes.size()) == expected.get<std::string>();
      std::printf("  %-22s %s\n", file.c_str(), valid ? "sha256 ok" : "sha256 MISMATCH");
      if (valid) print_tensors(SafetensorsFile(std::move(bytes), "\"" + f.string() + "\""), "    ");
    } catch (const UserError& e) {
      std::printf("  %-22s unreadable: %s\n", file.c_str(), e.what());
    }
  }
  std::fflush(stdout);
  try {
    load_checkpoint(path);
  } catch (const UserError& e) {
    throw UserError(std::string(e.what()) + " (NOT valid: resume would skip this checkpoint)");
  }
  std::printf("  valid\n");
}

}  // namespace

void inspect(const std::string& path) {
  const PathKind kind = path_kind(path, "inspect");
  if (kind == PathKind::missing) throw UserError("inspect: \"" + path + "\" does not exist; expected a checkpoint "
                                                 "directory, a .safetensors file or an llm.c model file");
  if (kind == PathKind::directory) return inspect_checkpoint(path);
  if (fs::path(path).extension() == ".safetensors") {
    const SafetensorsFile st = SafetensorsFile::read(path);
    std::printf("safetensors %s\n", path.c_str());
    print_tensors(st, "  ");
    return;
  }
  const LlmcModel m = read_llmc(path, "inspect:");
  std::printf("llm.c model file %s\n  version %d (%s), max_seq_len %d, vocab_size %d (padded %d), n_layer %d, n_head %d, "
              "n_embd %d\n  %zu parameters\n",
              path.c_str(), m.version, m.version == 3 ? "fp32" : "bf16", m.max_seq_len, m.vocab_size, m.padded_vocab,
              m.n_layer, m.n_head, m.n_embd, m.params.size());
}

void export_llmc(const std::string& checkpoint, const std::string& out, const std::string& dtype) {
  if (dtype != "fp32" && dtype != "bf16") throw UserError("--dtype: \"" + dtype + "\"; expected fp32 or bf16");
  // The output is checked before the checkpoint is read: a bad --out writes nothing.
  const PathKind out_kind = path_kind(out, "--out");
  if (out_kind == PathKind::directory)
    throw UserError("--out: \"" + out + "\" is a directory; expected the path of the model file to write");
  if (out_kind == PathKind::other)
    throw UserError("--out: \"" + out + "\" exists and is not a regular file (a device or FIFO); expected the path of "
                    "the model file to write");
  const fs::path parent = fs::absolute(out).lexically_normal().parent_path();
  check_creatable(parent.string(), "--out", fs::path(out).filename().string().size() + 8);
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
  write_llmc(out, file);
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
  check_hf_destination(o.out, "--out", o.checkpoint, o.force);
  const LoadedCheckpoint ckpt = load_checkpoint(o.checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  try {
    contents.specs = hf_tensor_specs(m);
  } catch (const UserError& e) {
    throw UserError("--checkpoint " + o.checkpoint + ": " + e.what());
  }
  int end_of_text = -1;
  if (ckpt.state.tokenizer == "gpt2") {
    const Tokenizer tokenizer = Tokenizer::load("gpt2", o.vocabulary);
    end_of_text = tokenizer.end_of_text();
    contents.text_files["vocab.json"] = gpt2_vocab_json(*tokenizer.gpt2());
    contents.text_files["merges.txt"] = gpt2_merges_txt(*tokenizer.gpt2());
    contents.text_files["tokenizer_config.json"] = gpt2_tokenizer_config(m.seq_len);
  }
  const char* torch_dtype = dtype == StDtype::f32 ? "float32" : dtype == StDtype::bf16 ? "bfloat16" : "float16";
  contents.text_files["config.json"] = hf_config_json(m, end_of_text, torch_dtype).dump(2) + "\n";
  const std::vector<float> flat = flat_weights(ckpt, m);
  contents.flat = flat.data();
  const std::vector<std::string> files = write_hf_directory(o.out, contents);
  std::printf("wrote %s: Hugging Face %s model (%s), %zu tensors in %zu safetensors file%s%s\n", o.out.c_str(),
              m.arch == Arch::llama ? "LlamaForCausalLM" : "GPT2LMHeadModel", o.dtype.c_str(), contents.specs.size(),
              files.size(), files.size() == 1 ? "" : "s", end_of_text >= 0 ? ", GPT-2 tokenizer files" : "");
}

}  // namespace ptrain
