#include "data/hf_tokenizer_files.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "core/sha256.h"

namespace ptrain {
namespace {

std::string spelled(std::string_view bytes) {
  std::string out;
  for (const char ch : bytes) {
    const char32_t c = gpt2_byte_to_unicode(static_cast<uint8_t>(ch));
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {  // below U+0200: two UTF-8 bytes
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// Byte-pair encoding of `bytes` with the merges of priority below `limit`, lowest first and
// leftmost on ties: the places between the parts it stops at.
std::vector<uint32_t> merge_below(const BpeVocabulary& v, std::string_view bytes, uint32_t limit) {
  std::vector<uint32_t> starts(bytes.size() + 1);  // part i is bytes[starts[i], starts[i + 1])
  for (size_t i = 0; i < starts.size(); ++i) starts[i] = static_cast<uint32_t>(i);
  while (starts.size() > 2) {
    size_t best = starts.size();
    uint32_t best_priority = limit;
    for (size_t i = 0; i + 2 < starts.size(); ++i) {
      const uint32_t p =
          v.join_priority(bytes.substr(starts[i], starts[i + 2] - starts[i]), starts[i + 1] - starts[i]);
      if (p < best_priority) {
        best_priority = p;
        best = i;
      }
    }
    if (best == starts.size()) break;
    starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return starts;
}

// The merges of merges.txt, as tokenizer.json lists them.
nlohmann::ordered_json merge_list(const std::string& merges_txt) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  size_t at = merges_txt.find('\n');  // after "#version: 0.2"
  while (at != std::string::npos && at + 1 < merges_txt.size()) {
    const size_t end = merges_txt.find('\n', at + 1);
    list.push_back(merges_txt.substr(at + 1, end == std::string::npos ? std::string::npos : end - at - 1));
    at = end;
  }
  return list;
}

// Where model.vocab goes in a tokenizer.json until its text is put there: an ordered_json object
// of 200,000 keys would take quadratic time to build (it searches its keys as a list).
constexpr const char* kVocabSlot = "\x01vocab\x01";

// tokenizer.json's byte-level BPE model, the vocabulary left to with_vocab. `regex`: the
// pre-tokenizer splits with GPT-2's pattern first (ByteLevel's use_regex).
nlohmann::ordered_json byte_level_tokenizer(nlohmann::ordered_json added_tokens, nlohmann::ordered_json merges,
                                            bool regex) {
  const auto byte_level = [&](bool add_prefix_space, bool trim_offsets) {
    return nlohmann::ordered_json{{"type", "ByteLevel"},
                                  {"add_prefix_space", add_prefix_space},
                                  {"trim_offsets", trim_offsets},
                                  {"use_regex", regex}};
  };
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added_tokens);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level(false, true);
  j["post_processor"] = byte_level(true, false);
  j["decoder"] = byte_level(true, true);
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", kVocabSlot},
                {"merges", std::move(merges)}};
  return j;
}

// `j` as text with `vocab_json` (a JSON object's text) in place of the vocabulary.
std::string with_vocab(const nlohmann::ordered_json& j, std::string vocab_json) {
  std::string text = j.dump();
  const std::string slot = nlohmann::ordered_json(kVocabSlot).dump();
  while (!vocab_json.empty() && vocab_json.back() == '\n') vocab_json.pop_back();
  text.replace(text.find(slot), slot.size(), vocab_json);
  return text + "\n";
}

// A JSON object of the spelled strings and their ids, in id order.
std::string vocab_object(const std::vector<std::pair<std::string, int>>& entries) {
  std::string out = "{";
  for (const auto& [key, id] : entries) {
    if (out.size() > 1) out += ',';
    out += nlohmann::ordered_json(key).dump() + ":" + std::to_string(id);
  }
  return out + "}\n";
}

nlohmann::ordered_json added_token(const AddedToken& s) {
  return {{"id", s.id},         {"content", s.text},     {"single_word", false}, {"lstrip", false},
          {"rstrip", false},    {"normalized", false},   {"special", true}};
}

}  // namespace

std::string bpe_vocab_json(const BpeVocabulary& v) {
  std::vector<std::pair<std::string, int>> entries;
  for (int id = 0; id < v.size(); ++id) {
    const auto token = static_cast<uint32_t>(id);
    if (!v.has(token)) continue;  // an id no token has
    entries.emplace_back(v.is_special(token) ? std::string(v.bytes(token)) : spelled(v.bytes(token)), id);
  }
  return vocab_object(entries);
}

std::string bpe_merges_txt(const BpeVocabulary& v) {
  std::vector<uint32_t> merged;  // the tokens a merge makes, in priority order
  for (int id = 0; id < v.size(); ++id) {
    const auto token = static_cast<uint32_t>(id);
    if (v.has(token) && !v.is_special(token) && v.bytes(token).size() > 1) merged.push_back(token);
  }
  std::sort(merged.begin(), merged.end(), [&](uint32_t a, uint32_t b) { return v.priority(a) < v.priority(b); });
  std::string out = "#version: 0.2\n";
  for (const uint32_t token : merged) {
    const std::string_view bytes = v.bytes(token);
    const std::vector<uint32_t> cuts = merge_below(v, bytes, v.priority(token));
    if (cuts.size() != 3)
      throw UserError("the vocabulary (" + v.source() + ") has token " + std::to_string(token) +
                      " that no single merge makes; expected a byte-pair vocabulary");
    out += spelled(bytes.substr(0, cuts[1])) + " " + spelled(bytes.substr(cuts[1])) + "\n";
  }
  return out;
}

std::string gpt2_tokenizer_config(int model_max_length) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "GPT2Tokenizer";
  if (model_max_length > 0) j["model_max_length"] = model_max_length;
  j["bos_token"] = kEndOfText;
  j["eos_token"] = kEndOfText;
  j["unk_token"] = kEndOfText;
  j["add_prefix_space"] = false;
  return j.dump(2) + "\n";
}

std::string gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt, uint32_t end_of_text) {
  return with_vocab(byte_level_tokenizer(nlohmann::ordered_json::array({added_token({kEndOfText, end_of_text})}),
                                         merge_list(merges_txt), true),
                    vocab_json);
}

std::string gpt2_special_tokens_map() {
  const nlohmann::ordered_json j = {{"bos_token", kEndOfText}, {"eos_token", kEndOfText}, {"unk_token", kEndOfText}};
  return j.dump(2) + "\n";
}

std::string tiktoken_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt,
                                    const BpeVocabulary& v, const std::string& pattern) {
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (const AddedToken& s : v.specials()) added.push_back(added_token(s));
  nlohmann::ordered_json j = byte_level_tokenizer(std::move(added), merge_list(merges_txt), false);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers",
                         {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                          j["pre_tokenizer"]}}};
  j["model"]["ignore_merges"] = true;  // tiktoken takes a piece that is a token as it is
  return with_vocab(j, vocab_json);
}

std::string fast_tokenizer_config(int model_max_length, const std::string& document_token) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (model_max_length > 0) j["model_max_length"] = model_max_length;
  if (!document_token.empty()) j["bos_token"] = j["eos_token"] = document_token;
  return j.dump(2) + "\n";
}

std::string special_tokens_map(const std::string& document_token) {
  if (document_token.empty()) return "{}\n";
  const nlohmann::ordered_json j = {{"bos_token", document_token}, {"eos_token", document_token}};
  return j.dump(2) + "\n";
}

std::string bytes_tokenizer_json() {
  std::vector<std::pair<std::string, int>> entries;
  for (int byte = 0; byte < 256; ++byte) entries.emplace_back(spelled(std::string(1, static_cast<char>(byte))), byte);
  return with_vocab(byte_level_tokenizer(nlohmann::ordered_json::array(), nlohmann::ordered_json::array(), false),
                    vocab_object(entries));
}

HfTokenizerFiles hf_tokenizer_files(const Tokenizer& tokenizer, int model_max_length) {
  HfTokenizerFiles out;
  std::map<std::string, std::string>& files = out.files;
  const std::string& name = tokenizer.name();
  if (name == "bytes") {
    files["tokenizer.json"] = bytes_tokenizer_json();
    files["tokenizer_config.json"] = fast_tokenizer_config(model_max_length, "");
    files["special_tokens_map.json"] = special_tokens_map("");
    return out;
  }
  const BpeVocabulary& v = *tokenizer.bpe();
  if (tokenizer.has_end_of_text()) out.end_of_text = static_cast<int>(tokenizer.end_of_text());
  if (name == "gpt2") {
    const std::string& vocab = files["vocab.json"] = bpe_vocab_json(v);
    const std::string& merges = files["merges.txt"] = bpe_merges_txt(v);
    files["tokenizer_config.json"] = gpt2_tokenizer_config(model_max_length);
    files["tokenizer.json"] = gpt2_tokenizer_json(vocab, merges, tokenizer.end_of_text());
    files["special_tokens_map.json"] = gpt2_special_tokens_map();
    return out;
  }
  const std::string document_token = tokenizer.has_end_of_text() ? std::string(v.bytes(tokenizer.end_of_text())) : "";
  // A tokenizer read from a tokenizer.json is written as that file; a tiktoken encoding's from
  // its ranks.
  if (is_tokenizer_json_name(name)) {
    std::string& file = files["tokenizer.json"] =
        InputFile(v.source(), "tokenizer.json \"" + v.source() + "\"").read_all(int64_t{256} << 20);
    if (sha256_hex(file.data(), file.size()) != v.sha256())
      throw UserError("tokenizer.json \"" + v.source() + "\" changed while it was read again; expected it unchanged");
  } else {
    files["tokenizer.json"] =
        tiktoken_tokenizer_json(bpe_vocab_json(v), bpe_merges_txt(v), v, tokenizer.pretokenizer()->pattern());
  }
  files["tokenizer_config.json"] = fast_tokenizer_config(model_max_length, document_token);
  files["special_tokens_map.json"] = special_tokens_map(document_token);
  return out;
}

}  // namespace ptrain
