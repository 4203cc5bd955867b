#include "train/checkpoint_model.h"

#include "core/error.h"
#include "core/format.h"
#include "core/tensor.h"
#include "precision/int8_weights.h"

namespace ptrain {

namespace {

// Replaces the block linears' weights by their INT8 round trip; returns how many weights that was.
int64_t quantize_block_linears(Transformer& model) {
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
  model.weights_loaded();
  return quantized;
}

}  // namespace

WeightFormat parse_weight_format(const std::string& text) {
  if (text == "fp32") return WeightFormat::fp32;
  if (text == "int8") return WeightFormat::int8;
  throw UserError("--weights: \"" + text + "\"; expected fp32 (the checkpoint's masters) or int8");
}

LoadedModel load_model(const LoadedCheckpoint& ckpt, const ModelConfig& m, int B, int T,
                       WeightFormat weights) {
  LoadedModel out;
  out.model = std::make_unique<Transformer>(ModelShape::of(m), *out.backend, DType::f32, B, T);
  load_weights(ckpt.weights, *out.model);
  if (weights == WeightFormat::int8) quantize_block_linears(*out.model);
  return out;
}

// "786,432 of 842,496 parameters (the block linears) in INT8, per output channel".
std::string int8_note(const ModelConfig& m) {
  int64_t linear = 0, all = 0;
  for (const ParamSpec& spec : param_specs(ModelShape::of(m))) {
    const int64_t n = shape_numel(spec.shape);
    all += n;
    if (is_block_linear(spec.id)) linear += n;
  }
  return format_thousands(static_cast<double>(linear)) + " of " + format_thousands(static_cast<double>(all)) +
         " parameters (the block linears) in INT8, per output channel";
}

std::vector<float> flat_weights(const LoadedCheckpoint& ckpt, const ModelConfig& m) {
  std::vector<float> flat;
  for (const ParamSpec& spec : param_specs(ModelShape::of(m))) {
    const int64_t n = shape_numel(spec.shape);
    const size_t at = flat.size();
    flat.resize(at + static_cast<size_t>(n));
    ckpt.weights.copy_to(spec.name, flat.data() + at, n);
  }
  return flat;
}

std::optional<Tokenizer> checkpoint_tokenizer(const LoadedCheckpoint& ckpt, const std::string& name,
                                              const std::string& vocabulary) {
  if ((name.empty() || name == "bytes") && !vocabulary.empty())
    throw UserError("--vocab " + vocabulary + ": --checkpoint " + ckpt.path + " was trained on " +
                    (name.empty() ? std::string("token ids without a tokenizer (synthetic data)") : "bytes") +
                    ", which take no vocabulary; expected no --vocab");
  if (name.empty()) return std::nullopt;
  Tokenizer tokenizer = Tokenizer::load(name, vocabulary);
  const std::string& trained = ckpt.state.vocabulary_sha256;
  if (name != "bytes" && !trained.empty() && tokenizer.vocabulary_sha256() != trained)
    throw UserError((vocabulary.empty() ? "the default " + name + " vocabulary (" + default_vocabulary(name) + ")"
                                        : "--vocab " + vocabulary) +
                    " has SHA-256 " + tokenizer.vocabulary_sha256() + ", but --checkpoint " + ckpt.path +
                    " was trained on shards made with the vocabulary of SHA-256 " + trained +
                    "; expected the files the shards were made with: --vocab naming those given to data prepare "
                    "--vocab, or no --vocab for the default one");
  return tokenizer;
}

}  // namespace ptrain
