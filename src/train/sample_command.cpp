#include "train/sample_command.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "core/format.h"
#include "core/rng.h"
#include "data/tokenizer.h"
#include "train/sampling.h"

namespace ptrain {

namespace {

// The prompt as token ids: text through the tokenizer, or written-out ids when there is none.
std::vector<int32_t> encode_prompt(const std::string& prompt, const Tokenizer* tokenizer, int vocab) {
  std::vector<int32_t> ids;
  if (tokenizer) {
    for (const uint32_t id : tokenizer->encode(prompt, "--prompt")) ids.push_back(static_cast<int32_t>(id));
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

// Standard output closed by its reader (`ptrain sample | head -1`): generating on is pointless.
struct OutputClosed {};

}  // namespace

void sample(const SampleOptions& o) {
  if (o.tokens < 1) throw UserError("--tokens: " + std::to_string(o.tokens) + "; expected at least 1");
  if (!std::isfinite(o.temperature) || o.temperature < 0)
    throw UserError("--temperature: " + number_text(o.temperature) + "; expected a finite number, 0 (greedy) or more");
  if (o.top_k < 0) throw UserError("--top-k: expected 0 (no limit) or more");
  const LoadedCheckpoint ckpt = load_checkpoint(o.checkpoint);
  const ModelConfig m = model_from_json(ckpt.state.model);
  // Checkpoints from before tokenizers were recorded: a 256-token vocabulary was bytes.
  std::string name = ckpt.state.tokenizer;
  if (name.empty() && m.vocab_size == 256) name = "bytes";
  const std::optional<Tokenizer> tokenizer = checkpoint_tokenizer(ckpt, name, o.vocabulary);
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
  try {
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
      if (std::fflush(stdout) != 0) {
        if (errno == EPIPE) throw OutputClosed{};
        throw EnvironmentError(std::string("sample: writing the tokens to standard output failed: ") +
                               std::strerror(errno));
      }
    });
  } catch (const OutputClosed&) {
    return;  // the reader has what it wanted
  }
  std::printf("\n");
  if (o.timing) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr, "sample: %d tokens in %.3f s, %.1f tokens/s (%s, context %d)\n", generated, seconds,
                 generated / seconds, o.kv_cache ? "KV cache" : "whole window per token", m.seq_len);
  }
}

}  // namespace ptrain
