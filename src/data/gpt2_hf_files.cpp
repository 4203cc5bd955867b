#include "data/gpt2_hf_files.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

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
// leftmost on ties: the pieces (as byte strings) it stops at.
std::vector<std::string> merge_below(const Gpt2Vocabulary& v, std::string_view bytes, uint32_t limit) {
  std::vector<std::string> parts;
  for (const char ch : bytes) parts.emplace_back(1, ch);
  while (parts.size() > 1) {
    size_t best = parts.size();
    uint32_t best_priority = limit;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      const uint32_t id = v.id(parts[i] + parts[i + 1]);
      if (id != Gpt2Vocabulary::kNone && v.priority(id) < best_priority) {
        best_priority = v.priority(id);
        best = i;
      }
    }
    if (best == parts.size()) break;
    parts[best] += parts[best + 1];
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  return parts;
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

// tokenizer.json's byte-level BPE model. `regex`: the pre-tokenizer splits with GPT-2's pattern
// first (ByteLevel's use_regex).
nlohmann::ordered_json byte_level_tokenizer(nlohmann::ordered_json added_tokens, nlohmann::ordered_json vocab,
                                            nlohmann::ordered_json merges, bool regex) {
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
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  return j;
}

}  // namespace

std::string gpt2_vocab_json(const Gpt2Vocabulary& v) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (int id = 0; id < v.size(); ++id) {
    const auto token = static_cast<uint32_t>(id);
    j[token == v.end_of_text() ? std::string(kEndOfText) : spelled(v.bytes(token))] = id;
  }
  return j.dump() + "\n";
}

std::string gpt2_merges_txt(const Gpt2Vocabulary& v) {
  std::vector<uint32_t> merged;  // the tokens a merge makes, in priority order
  for (int id = 0; id < v.size(); ++id) {
    const auto token = static_cast<uint32_t>(id);
    if (token != v.end_of_text() && v.bytes(token).size() > 1) merged.push_back(token);
  }
  std::sort(merged.begin(), merged.end(), [&](uint32_t a, uint32_t b) { return v.priority(a) < v.priority(b); });
  std::string out = "#version: 0.2\n";
  for (const uint32_t token : merged) {
    const std::vector<std::string> halves = merge_below(v, v.bytes(token), v.priority(token));
    if (halves.size() != 2)
      throw UserError("the GPT-2 vocabulary (" + v.source() + ") has token " + std::to_string(token) +
                      " that no single merge makes; expected a byte-pair vocabulary");
    out += spelled(halves[0]) + " " + spelled(halves[1]) + "\n";
  }
  return out;
}

std::string gpt2_tokenizer_config(int model_max_length) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "GPT2Tokenizer";
  j["model_max_length"] = model_max_length;
  j["bos_token"] = kEndOfText;
  j["eos_token"] = kEndOfText;
  j["unk_token"] = kEndOfText;
  j["add_prefix_space"] = false;
  return j.dump(2) + "\n";
}

std::string gpt2_tokenizer_json(const std::string& vocab_json, const std::string& merges_txt, uint32_t end_of_text) {
  const nlohmann::ordered_json added = {{"id", end_of_text}, {"content", kEndOfText}, {"single_word", false},
                                        {"lstrip", false},   {"rstrip", false},        {"normalized", false},
                                        {"special", true}};
  return byte_level_tokenizer(nlohmann::ordered_json::array({added}), nlohmann::ordered_json::parse(vocab_json),
                              merge_list(merges_txt), true)
             .dump() +
         "\n";
}

std::string gpt2_special_tokens_map() {
  const nlohmann::ordered_json j = {{"bos_token", kEndOfText}, {"eos_token", kEndOfText}, {"unk_token", kEndOfText}};
  return j.dump(2) + "\n";
}

std::string bytes_tokenizer_json() {
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (int byte = 0; byte < 256; ++byte) vocab[spelled(std::string(1, static_cast<char>(byte)))] = byte;
  return byte_level_tokenizer(nlohmann::ordered_json::array(), std::move(vocab), nlohmann::ordered_json::array(), false)
             .dump() +
         "\n";
}

std::string bytes_tokenizer_config(int model_max_length) {
  nlohmann::ordered_json j;
  j["tokenizer_class"] = "PreTrainedTokenizerFast";
  j["model_max_length"] = model_max_length;
  return j.dump(2) + "\n";
}

std::string bytes_special_tokens_map() { return "{}\n"; }

}  // namespace ptrain
