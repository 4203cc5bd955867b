// The values of the config's choice keys, as types. The YAML loader reads each key's string into
// its enum once (config.cpp), and writes it back by the same table; state.json's copies of some of
// them are read through the same tables. Nothing else in ptrain compares a config string.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace ptrain {

enum class DeviceRequest { auto_, cpu, cuda };            // run.device
enum class AttentionRequest { auto_, cudnn, fallback };   // model.attention
enum class Arch { gpt2, llama };                          // model.arch
enum class TieEmbeddings { auto_, yes, no };              // model.tie_embeddings
enum class TokenizerChoice { auto_, bytes, gpt2, cl100k_base, o200k_base, llama3, hf };  // data.tokenizer (auto_ first)
enum class Recompute { none, mlp, block };                // training.recompute
enum class GuardAction { stop, skip, rollback };          // training.guard.action
enum class Decay { cosine, linear, constant, wsd };       // schedule.decay
enum class PrecisionMode { fp32, bf16, fp16, fp8 };       // precision.mode, a schedule phase's mode
enum class Fp8Recipe { delayed, current, block };         // precision.fp8.recipe
enum class Fp8Format { hybrid, e4m3 };                    // precision.fp8.format
enum class AmaxAlgo { max, most_recent };                 // precision.fp8.amax_algo
enum class LossScalingMode { auto_, off, static_, dynamic };  // precision.loss_scaling.mode
enum class OnSaveError { stop, continue_ };               // checkpoint.on_save_error
enum class GradReduceDtype { fp32, bf16 };                // distributed.grad_reduce_dtype

// Each enum's names as the config writes them, in the order of its values.
template <typename E>
struct ChoiceNames;
#define PTRAIN_CHOICE_NAMES(E, ...)                                 \
  template <>                                                       \
  struct ChoiceNames<E> {                                           \
    static constexpr std::array names = {__VA_ARGS__};              \
  }
PTRAIN_CHOICE_NAMES(DeviceRequest, "auto", "cpu", "cuda");
PTRAIN_CHOICE_NAMES(AttentionRequest, "auto", "cudnn", "fallback");
PTRAIN_CHOICE_NAMES(Arch, "gpt2", "llama");
PTRAIN_CHOICE_NAMES(TieEmbeddings, "auto", "true", "false");
PTRAIN_CHOICE_NAMES(TokenizerChoice, "auto", "bytes", "gpt2", "cl100k_base", "o200k_base", "llama3", "hf");
PTRAIN_CHOICE_NAMES(Recompute, "none", "mlp", "block");
PTRAIN_CHOICE_NAMES(GuardAction, "stop", "skip", "rollback");
PTRAIN_CHOICE_NAMES(Decay, "cosine", "linear", "constant", "wsd");
PTRAIN_CHOICE_NAMES(PrecisionMode, "fp32", "bf16", "fp16", "fp8");
PTRAIN_CHOICE_NAMES(Fp8Recipe, "delayed", "current", "block");
PTRAIN_CHOICE_NAMES(Fp8Format, "hybrid", "e4m3");
PTRAIN_CHOICE_NAMES(AmaxAlgo, "max", "most_recent");
PTRAIN_CHOICE_NAMES(LossScalingMode, "auto", "off", "static", "dynamic");
PTRAIN_CHOICE_NAMES(OnSaveError, "stop", "continue");
PTRAIN_CHOICE_NAMES(GradReduceDtype, "fp32", "bf16");
#undef PTRAIN_CHOICE_NAMES

// In JSON (metrics.jsonl, state.json, summaries) a choice is its name, as the config writes it,
// never its number: nlohmann::json finds these through ADL and prefers them to its own
// enum-as-integer conversion (more specialised).
#define PTRAIN_CHOICE_JSON(E)                    \
  template <typename Json>                       \
  void to_json(Json& j, const E& value) {        \
    j = ChoiceNames<E>::names[static_cast<size_t>(value)]; \
  }
PTRAIN_CHOICE_JSON(DeviceRequest)
PTRAIN_CHOICE_JSON(AttentionRequest)
PTRAIN_CHOICE_JSON(Arch)
PTRAIN_CHOICE_JSON(TieEmbeddings)
PTRAIN_CHOICE_JSON(TokenizerChoice)
PTRAIN_CHOICE_JSON(Recompute)
PTRAIN_CHOICE_JSON(GuardAction)
PTRAIN_CHOICE_JSON(Decay)
PTRAIN_CHOICE_JSON(PrecisionMode)
PTRAIN_CHOICE_JSON(Fp8Recipe)
PTRAIN_CHOICE_JSON(Fp8Format)
PTRAIN_CHOICE_JSON(AmaxAlgo)
PTRAIN_CHOICE_JSON(LossScalingMode)
PTRAIN_CHOICE_JSON(OnSaveError)
PTRAIN_CHOICE_JSON(GradReduceDtype)
#undef PTRAIN_CHOICE_JSON

// "fp8", "most_recent", ...: the name the config uses for the value.
template <typename E>
const char* choice_name(E value) {
  return ChoiceNames<E>::names[static_cast<size_t>(value)];
}

// The value a name stands for; nothing for a name that is not one of E's.
template <typename E>
std::optional<E> parse_choice(const std::string& name) {
  const auto& names = ChoiceNames<E>::names;
  for (size_t i = 0; i < names.size(); ++i)
    if (name == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

// The FP8 GEMMs' shape rule, kept on every backend so that a config that trains on the CPU also
// trains on a GPU: each dimension of a linear layer's three GEMMs (its input width C, output width
// OC, and the micro-batch's rows, over which the weight gradient contracts) a multiple of 16
// (cuBLASLt's FP8 leading dimensions are multiples of 16 bytes), and of 128 for block scaling
// (whole 1x128 tiles and 128x128 blocks).
constexpr int fp8_dimension_multiple(Fp8Recipe recipe) { return recipe == Fp8Recipe::block ? 128 : 16; }
// "" when a linear layer of these dimensions can run its GEMMs in FP8 under the recipe, else why not.
inline std::string fp8_layer_problem(int64_t rows, int64_t C, int64_t OC, Fp8Recipe recipe) {
  const int64_t m = fp8_dimension_multiple(recipe);
  if (rows % m == 0 && C % m == 0 && OC % m == 0) return "";
  return "the FP8 GEMMs of a " + std::to_string(C) + " -> " + std::to_string(OC) + " layer over " +
         std::to_string(rows) + " rows need dimensions that are multiples of " + std::to_string(m) +
         (recipe == Fp8Recipe::block ? " (recipe block)" : "");
}

}  // namespace ptrain
