#include "data/hf_tokenizer_json.h"

#include <cctype>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "config/config.h"
#include "core/sha256.h"
#include "data/pretokenizer.h"

namespace ptrain {

namespace {

constexpr int64_t kMaxTokenizerJsonBytes = 256 << 20;

using json = nlohmann::json;

std::string type_of(const json& j) { return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : ""; }


class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)), what_("tokenizer.json \"" + path_ + "\"") {}

  // A boolean key; a value of another type is refused, as Hugging Face's tokenizers refuses it.
  bool flag(const json& j, const char* key, bool otherwise) const {
    if (!j.contains(key) || j[key].is_null()) return otherwise;
    if (!j[key].is_boolean()) throw UserError(what_ + ": \"" + key + "\" is " + j[key].dump() + "; expected true or false");
    return j[key].get<bool>();
  }

  [[noreturn]] void refuse(const std::string& part, const std::string& found, const std::string& expected) const {
    throw UserError(what_ + ": " + part + " is " + found + "; ptrain runs " + expected +
                    " (a tokenizer it would run otherwise than Hugging Face's is refused)");
  }

  // What Hugging Face's tokenizers cannot read either.
  [[noreturn]] void malformed(const std::string& part, const std::string& found, const std::string& expected) const {
    throw UserError(what_ + ": " + part + " is " + found + "; expected " + expected);
  }

  // j[key], a key of `owner`'s that tokenizers requires (it has no default) to pass `is_type`.
  const json& required(const json& j, const char* key, bool (json::*is_type)() const noexcept,
                       const std::string& owner, const char* expected) const {
    if (!j.contains(key) || !(j[key].*is_type)())
      malformed(owner + "'s \"" + key + "\"", j.contains(key) ? j[key].dump() : "missing", expected);
    return j[key];
  }

  Normalizer normalizer(const json& n) const {
    if (n.is_null()) return {};
    using Kind = NormalizerStep::Kind;
    const std::string type = type_of(n);
    const std::string owner = "the " + type + " normalizer";
    const auto text = [&](const char* key) {
      return required(n, key, &json::is_string, owner, "a string").get<std::string>();
    };
    if (type == "Sequence" && n.contains("normalizers") && n["normalizers"].is_array()) {
      Normalizer steps;
      for (const json& part : n["normalizers"])
        for (NormalizerStep& step : normalizer(part)) steps.push_back(std::move(step));
      return steps;
    }
    static const std::map<std::string, Kind> kForms = {
        {"NFC", Kind::nfc},   {"NFD", Kind::nfd},
        {"NFKC", Kind::nfkc}, {"NFKD", Kind::nfkd},
        {"Lowercase", Kind::lowercase}};
    if (const auto form = kForms.find(type); form != kForms.end()) return {{form->second, "", "", false, false}};
    if (type == "Strip") {
      const bool left = required(n, "strip_left", &json::is_boolean, owner, "true or false").get<bool>();
      const bool right = required(n, "strip_right", &json::is_boolean, owner, "true or false").get<bool>();
      return {{Kind::strip, "", "", left, right}};
    }
    if (type == "Prepend") return {{Kind::prepend, text("prepend"), "", false, false}};
    if (type == "Replace") {
      const json pattern = n.value("pattern", json());
      // tokenizers finds an empty literal between every two characters; nobody means that.
      if (!pattern.is_object() || !pattern.contains("String") || !pattern["String"].is_string() ||
          pattern["String"].get<std::string>().empty())
        refuse("the Replace normalizer's pattern", pattern.dump().substr(0, 80), "a Replace of a non-empty String");
      return {{Kind::replace, pattern["String"].get<std::string>(), text("content"), false, false}};
    }
    refuse("normalizer", type.empty() ? n.dump().substr(0, 80) : type,
           "no normalizer, or NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend or Replace of a String, alone or in "
           "a Sequence");
  }

  // The Splits the pre-tokenizer makes: any Splits and Digits, then ByteLevel (with GPT-2's
  // regex as one more Split when its use_regex is on), in a Sequence or alone.
  // `prefix_space_at` gets the number of Splits before ByteLevel when its add_prefix_space is on.
  std::vector<SplitRule> splits(const json& p, size_t& prefix_space_at) const {
    const std::string expected =
        "byte-level BPE: ByteLevel, or a Sequence of Splits and Digits that ends in ByteLevel";
    std::vector<const json*> steps;
    flatten(p, steps);
    std::vector<SplitRule> rules;
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& step = *steps[i];
      const std::string type = type_of(step);
      const bool last = i + 1 == steps.size();
      if (type == "ByteLevel" && last) {
        // Hugging Face's tokenizers refuses a ByteLevel without these two (use_regex: true).
        const std::string owner = "pre_tokenizer's ByteLevel";
        required(step, "trim_offsets", &json::is_boolean, owner, "true or false");
        if (required(step, "add_prefix_space", &json::is_boolean, owner, "true or false").get<bool>())
          prefix_space_at = rules.size();
        if (flag(step, "use_regex", true)) rules.push_back({kGpt2Pattern});
      } else if (type == "Split") {
        rules.push_back(split(step));
      } else if (type == "Digits") {  // Rust's char::is_numeric: \p{N}, each alone or in runs
        const bool each = required(step, "individual_digits", &json::is_boolean, "pre_tokenizer's Digits",
                                   "true or false").get<bool>();
        rules.push_back({"\\p{N}", each ? SplitBehavior::isolated : SplitBehavior::contiguous});
      } else if (type == "ByteLevel") {
        refuse("pre_tokenizer", "a Sequence with ByteLevel before its end", expected);
      } else {
        refuse("pre_tokenizer", type.empty() ? step.dump().substr(0, 80) : type, expected);
      }
    }
    if (steps.empty() || type_of(*steps.back()) != "ByteLevel")
      refuse("pre_tokenizer", steps.empty() ? "an empty Sequence" : "without ByteLevel at its end", expected);
    return rules;
  }

  // What ptrain does not run but copies into an export (the decoder, the post-processor) must
  // load in Hugging Face's tokenizers: the version it reads, and each ByteLevel part's keys.
  void check_copied_parts(const json& j) const {
    if (!j.contains("version") || j["version"] != "1.0")
      malformed("\"version\"", j.contains("version") ? j["version"].dump() : "missing",
                "\"1.0\", the only one Hugging Face's tokenizers reads");
    for (const char* part : {"decoder", "post_processor"})
      if (j.contains(part)) require_byte_level_keys(j[part], part);
  }
  void require_byte_level_keys(const json& node, const std::string& owner) const {
    if (type_of(node) == "ByteLevel")
      for (const char* key : {"add_prefix_space", "trim_offsets"})
        required(node, key, &json::is_boolean, owner + "'s ByteLevel", "true or false");
    if (node.is_structured())
      for (const json& inner : node) require_byte_level_keys(inner, owner);
  }

  void flatten(const json& p, std::vector<const json*>& steps) const {
    if (type_of(p) != "Sequence") {
      steps.push_back(&p);
      return;
    }
    if (!p.contains("pretokenizers") || !p["pretokenizers"].is_array())
      refuse("pre_tokenizer", p.dump().substr(0, 80), "a Sequence with a list \"pretokenizers\"");
    for (const json& part : p["pretokenizers"]) flatten(part, steps);
  }

  SplitRule split(const json& s) const {
    SplitRule rule;
    const json pattern = s.value("pattern", json());
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
      rule.pattern = pattern["Regex"].get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") && pattern["String"].is_string() &&
               !pattern["String"].get<std::string>().empty()) {
      // A literal, as a regex: every ASCII character that is not a letter or digit escaped
      // (Hugging Face escapes the metacharacters among them; the others mean themselves either way).
      for (const char c : pattern["String"].get<std::string>()) {
        if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) rule.pattern += '\\';
        rule.pattern += c;
      }
    } else {
      refuse("a Split's pattern", pattern.dump().substr(0, 80), "a Split by a Regex or a non-empty String");
    }
    static const std::map<std::string, SplitBehavior> kBehaviors = {
        {"Removed", SplitBehavior::removed},
        {"Isolated", SplitBehavior::isolated},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous},
        {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    const json behavior = s.value("behavior", json());
    const auto found = behavior.is_string() ? kBehaviors.find(behavior.get<std::string>()) : kBehaviors.end();
    if (found == kBehaviors.end())
      refuse("a Split's behavior", behavior.dump().substr(0, 80),
             "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous");
    rule.behavior = found->second;
    rule.invert = required(s, "invert", &json::is_boolean, "pre_tokenizer's Split", "true or false").get<bool>();
    return rule;
  }

  std::vector<HfMerge> merges(const json& list) const {
    if (!list.is_array()) refuse("model.merges", list.type_name(), "a list of merges");
    std::vector<HfMerge> out;
    out.reserve(list.size());
    for (size_t i = 0; i < list.size(); ++i) {
      const json& m = list[i];
      const std::string where = what_ + " model.merges[" + std::to_string(i) + "]";
      if (m.is_string()) {  // "left right"
        const std::string text = m.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
          throw UserError(where + ": expected \"left right\"");
        out.push_back({text.substr(0, space), text.substr(space + 1), where});
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {  // ["left", "right"]
        out.push_back({m[0].get<std::string>(), m[1].get<std::string>(), where});
      } else {
        throw UserError(where + ": expected \"left right\" or [\"left\", \"right\"]");
      }
    }
    return out;
  }

  TokenizerJson read(const std::string& document_token, const std::string& sha256, const std::string& hint) {
    const std::string text = InputFile(path_, what_).read_all(kMaxTokenizerJsonBytes);
    const std::string hash = sha256_hex(text.data(), text.size());
    if (!sha256.empty() && hash != sha256)
      throw UserError(what_ + " has SHA-256 " + hash + ", expected " + sha256 +
                      ": the file is damaged or another vocabulary; " + hint);
    const json j = parse_json(text, what_);
    if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
      throw UserError(what_ + ": expected a JSON object with a \"model\", as Hugging Face's tokenizers writes");
    check_copied_parts(j);
    const json& model = j["model"];
    const std::string type = type_of(model);
    if (!type.empty() && type != "BPE") refuse("model.type", type, "BPE models only");
    if (flag(model, "byte_fallback", false))
      refuse("model.byte_fallback", "true (SentencePiece-style BPE)", "byte-level BPE, without byte fallback");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
      if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty())
        refuse(std::string("model.") + key, model[key].dump(), "byte-level BPE, without one");
    if (model.contains("dropout") && model["dropout"].is_number() && model["dropout"].get<double>() > 0)
      refuse("model.dropout", model["dropout"].dump(), "BPE without dropout");
    if (!model.contains("vocab") || !model.contains("merges"))
      throw UserError(what_ + ": expected model.vocab and model.merges");

    TokenizerJson t;
    t.normalizer = normalizer(j.value("normalizer", json()));
    if (!j.contains("pre_tokenizer") || j["pre_tokenizer"].is_null())
      refuse("pre_tokenizer", "missing", "byte-level BPE (a ByteLevel pre-tokenizer)");
    t.splits = splits(j["pre_tokenizer"], t.prefix_space_at);

    std::vector<AddedToken> added, words;
    std::vector<AddedToken> raw_words, normalized_words;
    bool has_document_token = document_token.empty();
    // Hugging Face gives each added token, in the file's order, the model's id for its text,
    // else the next of the ids counted from the vocabulary's size, whatever id the file says
    // (tokenizers' AddedVocabulary::add_tokens from 0.22 on, the version the oracle tests run):
    // ptrain reads the file's, so a file whose ids differ from those is refused.
    const json& vocab = model["vocab"];
    std::map<std::string, int64_t> hf_ids;
    int64_t hf_next = vocab.is_object() ? static_cast<int64_t>(vocab.size()) : 0;
    const auto hf_id = [&](const std::string& content) {
      const auto in_model = vocab.is_object() ? vocab.find(content) : vocab.end();
      if (in_model != vocab.end() && in_model->is_number_unsigned()) return in_model->get<int64_t>();
      if (const auto before = hf_ids.find(content); before != hf_ids.end()) return before->second;
      return hf_next++;
    };
    if (j.contains("added_tokens")) {
      if (!j["added_tokens"].is_array()) refuse("added_tokens", j["added_tokens"].type_name(), "a list");
      for (const json& a : j["added_tokens"]) {
        if (!a.is_object() || !a.contains("id") || !a["id"].is_number_unsigned() ||
            a["id"].get<uint64_t>() >= static_cast<uint64_t>(kMaxVocab) || !a.contains("content") ||
            !a["content"].is_string())
          throw UserError(what_ + ": added_tokens: expected {\"id\": N below " + std::to_string(kMaxVocab) +
                          ", \"content\": \"...\"}, found " + a.dump().substr(0, 80));
        // Hugging Face cuts every added token out of the text before the model sees it; ptrain,
        // as tiktoken's encode_ordinary, reads the text of a special token as text, and cuts
        // out the others (words added to the vocabulary) as Hugging Face does.
        const std::string content = a["content"].get<std::string>();
        if (content.empty()) refuse("added token with id " + a["id"].dump(), "empty", "some text");
        const auto id = a["id"].get<uint32_t>();
        const std::string owner = "added token " + a["content"].dump();
        const int64_t hf = hf_id(content);
        hf_ids.emplace(content, hf);
        if (id != hf)
          malformed(owner + "'s id", std::to_string(id),
                    std::to_string(hf) + ", the id Hugging Face gives it (the model's id for its text, else the "
                                         "next counted from the vocabulary's size over the added tokens not in "
                                         "it: tokenizers reads no other)");
        const bool special = required(a, "special", &json::is_boolean, owner, "true or false").get<bool>();
        for (const char* option : {"single_word", "lstrip", "rstrip"})  // Hugging Face needs each
          required(a, option, &json::is_boolean, owner, "true or false");
        const bool normalized = required(a, "normalized", &json::is_boolean, owner, "true or false").get<bool>();
        if (special) {
          added.push_back({content, id});
          has_document_token = has_document_token || content == document_token;
          continue;
        }
        if (content == (document_token.empty() ? kEndOfText : document_token))
          refuse(owner + ", which marks documents,", "not special",
                 "special (a word is cut out of any text, so a document's text would hold the marker)");
        for (const char* option : {"single_word", "lstrip", "rstrip"})
          if (flag(a, option, false))
            refuse(owner + "'s " + option, "true",
                   "false (ptrain cuts out a word that is not special wherever it is, as it is)");
        words.push_back({content, id});
        if (normalized) {
          const std::string spelled = normalize_text(content, t.normalizer);
          if (spelled.empty())
            refuse(owner + ", normalized,", "empty",
                   "words that normalize to some text");
          normalized_words.push_back({spelled, id});
        } else
          raw_words.push_back({content, id});
      }
    }
    if (!has_document_token)
      throw UserError(what_ + ": expected the added token " + document_token + ", which marks documents");
    t.vocabulary = std::make_shared<BpeVocabulary>(BpeVocabulary::from_hf_model(
        model["vocab"], merges(model["merges"]), added, words, flag(model, "ignore_merges", false),
        document_token.empty() ? kEndOfText : document_token, what_, hash, path_));
    t.raw_words = AddedWords(std::move(raw_words));
    t.normalized_words = AddedWords(std::move(normalized_words));
    return t;
  }

 private:
  std::string path_, what_;
};

}  // namespace

TokenizerJson read_tokenizer_json(const std::string& path, const std::string& document_token,
                                  const std::string& sha256, const std::string& hint) {
  return Reader(path).read(document_token, sha256, hint);
}

}  // namespace ptrain
