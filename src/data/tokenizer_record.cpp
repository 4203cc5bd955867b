#include "data/tokenizer_record.h"

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/json_input.h"
#include "core/output_file.h"
#include "core/paths.h"
#include "core/sha256.h"
#include "data/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;

void write_tokenizer_record(const std::string& dir, const TokenizerRecord& r) {
  const nlohmann::json j = {{"format", "ptrain-tokenizer"},
                            {"version", 1},
                            {"tokenizer", r.tokenizer},
                            {"vocab_size", r.vocab_size},
                            {"end_of_text", r.end_of_text},
                            {"vocabulary_sha256", r.vocabulary_sha256}};
  write_file_atomic((fs::path(dir) / kTokenizerRecord).string(), j.dump(2) + "\n");
}

std::optional<TokenizerRecord> read_tokenizer_record(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTokenizerRecord).string();
  const std::string what = "\"" + path + "\"";
  if (path_kind(path, kTokenizerRecord) == PathKind::missing) return std::nullopt;
  const nlohmann::json j = parse_json(InputFile(path, what).read_all(1 << 20), what);
  const auto bad = [&](const std::string& expected) {
    return UserError(what + " is malformed: expected " + expected + " (the record `ptrain data prepare` writes)");
  };
  if (!j.is_object() || !j.contains("format") || j["format"] != "ptrain-tokenizer") throw bad("\"format\": \"ptrain-tokenizer\"");
  if (!j.contains("version") || j["version"] != 1) throw bad("\"version\": 1");
  TokenizerRecord r;
  if (!j.contains("tokenizer") || !j["tokenizer"].is_string() || !is_tokenizer_name(j["tokenizer"].get<std::string>()))
    throw bad("\"tokenizer\": " + tokenizer_names());
  r.tokenizer = j["tokenizer"].get<std::string>();
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer() || j["vocab_size"] < 2 ||
      j["vocab_size"] > kMaxVocab)
    throw bad("\"vocab_size\": an integer in 2.." + std::to_string(kMaxVocab));
  r.vocab_size = j["vocab_size"].get<int>();
  if (!j.contains("end_of_text") || !j["end_of_text"].is_number_integer() || j["end_of_text"] < -1 ||
      j["end_of_text"] >= r.vocab_size)
    throw bad("\"end_of_text\": -1 or a token id below vocab_size");
  r.end_of_text = j["end_of_text"].get<int>();
  // Checkpoints copy it: one they could not read back would be lost.
  const bool hex = j.contains("vocabulary_sha256") && j["vocabulary_sha256"].is_string() &&
                   (j["vocabulary_sha256"] == "" || is_sha256_hex(j["vocabulary_sha256"].get<std::string>()));
  if (!hex) throw bad("\"vocabulary_sha256\": \"\" or 64 lowercase hexadecimal digits");
  r.vocabulary_sha256 = j["vocabulary_sha256"].get<std::string>();
  return r;
}

ShardTokenizer resolve_shard_tokenizer(const std::vector<std::string>& train, const std::vector<std::string>& val,
                                       TokenizerChoice configured_choice, int vocab_size,
                                       std::vector<std::string>& warnings) {
  // "" under auto: the records, or model.vocab_size, tell.
  const std::string configured = configured_choice == TokenizerChoice::auto_ ? "" : choice_name(configured_choice);
  std::vector<std::string> dirs;
  for (const auto* files : {&train, &val})
    for (const std::string& f : *files) {
      std::string dir = fs::path(f).parent_path().string();
      if (dir.empty()) dir = ".";
      if (std::find(dirs.begin(), dirs.end(), dir) == dirs.end()) dirs.push_back(dir);
    }
  std::optional<TokenizerRecord> found;
  std::string found_in;
  std::vector<std::string> without;
  for (const std::string& dir : dirs) {
    const std::optional<TokenizerRecord> record = read_tokenizer_record(dir);
    if (!record) {
      without.push_back(dir);
      continue;
    }
    const std::string where = "\"" + (fs::path(dir) / kTokenizerRecord).string() + "\"";
    if (found && (record->tokenizer != found->tokenizer || record->vocabulary_sha256 != found->vocabulary_sha256))
      throw UserError("the training and validation shards: " + where + " says they were made by " + record->tokenizer +
                      " but " + found_in + " says " + found->tokenizer +
                      (record->tokenizer == found->tokenizer ? " with another vocabulary" : "") +
                      "; expected one tokenizer for all the shards");
    if (!configured.empty() && record->tokenizer != configured)
      throw UserError("data.tokenizer is " + configured + " but " + where + " says the shards were made by " +
                      record->tokenizer + "; expected data.tokenizer: " + record->tokenizer +
                      " (or auto), or shards prepared with --tokenizer " + configured);
    if (record->vocab_size > vocab_size)
      throw UserError("model.vocab_size is " + std::to_string(vocab_size) + " but " + where + " says the shards hold " +
                      record->tokenizer + " ids up to " + std::to_string(record->vocab_size - 1) +
                      "; expected model.vocab_size: " + std::to_string(record->vocab_size) + " or more");
    found = record;
    found_in = where;
  }
  std::string resolved = found ? found->tokenizer : configured;
  if (!without.empty()) {
    std::string note = "the shards in \"" + without.front() + "\"" + (without.size() > 1 ? " and others" : "") +
                       " have no " + kTokenizerRecord + " (llm.c's scripts write none)";
    if (resolved.empty() && !found) {
      if (vocab_size >= 50257 && vocab_size <= 50304) resolved = choice_name(TokenizerChoice::gpt2);
      if (vocab_size == 256) resolved = choice_name(TokenizerChoice::bytes);
      note += resolved.empty() ? "; their tokenizer is unknown, so samples print token ids"
                                 : "; taking them as " + resolved + " from model.vocab_size " +
                                       std::to_string(vocab_size) + " (set data.tokenizer to say so)";
    } else {
      note += "; taking them as " + resolved;
      // Said by data.tokenizer alone: the model still needs an output for each of its ids.
      const int ids = tokenizer_ids(resolved);
      if (!found && ids > 0 && vocab_size < ids)
        throw UserError("model.vocab_size is " + std::to_string(vocab_size) + ", below the " + std::to_string(ids) +
                        " ids of the " + resolved + " tokenizer data.tokenizer names for shards without a " +
                        kTokenizerRecord + "; expected model.vocab_size: " + std::to_string(ids) +
                        " or more, or the tokenizer that made the shards");
    }
    warnings.push_back(note);
  }
  return {resolved, found ? found->vocabulary_sha256 : std::string()};
}

}  // namespace ptrain
